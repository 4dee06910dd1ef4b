#!/usr/bin/env bash
# mpirun for the tests: N ranks on this machine whatever its core count (--oversubscribe), each
# free to use every core (--bind-to none: Open MPI binds a rank to one core by default, which
# would put its OpenMP threads on that one core), and allowed to run as root.
#   tests/mpi/mpirun.sh MPIEXEC NP PROGRAM [ARGS...]
set -euo pipefail
mpiexec=$1 np=$2
shift 2
flags=(--oversubscribe --bind-to none -np "$np")
[[ $(id -u) == 0 ]] && flags+=(--allow-run-as-root)
exec "$mpiexec" "${flags[@]}" "$@"
