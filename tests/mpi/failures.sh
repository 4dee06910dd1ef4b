#!/usr/bin/env bash
# A rank that throws (in its loss, or in its backward with gradient sums in flight), is killed
# with SIGKILL, or is stopped with SIGSTOP in the middle of data-parallel training ends the whole
# job with a non-zero exit status and a message naming the cause, within two minutes (never a
# hang: the other rank is waiting for it in a sum at the time); a stopped rank within the
# collective timeout (2 s here) plus a margin.
#   tests/mpi/failures.sh MPIEXEC TEST_MPI
set -uo pipefail
here=$(dirname "$0")
mpiexec=$1 test=$2
failures=0
# The ranks' run directories: an aborted job cannot remove its own.
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/graft_mpi_failures.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

# case_ NAME EXPECTED SECONDS [VAR=VALUE...]: runs failures/NAME of test_mpi on 2 ranks (with the
# variables set), which must end within SECONDS.
case_() {
  local name=$1 expected=$2 most=$3 start=$SECONDS out rc
  shift 3
  out=$(env "$@" timeout 120 bash "$here/mpirun.sh" "$mpiexec" 2 "$test" --run_test="failures/$name" 2>&1)
  rc=$?
  local took=$((SECONDS - start))
  if [[ $rc == 0 || $rc == 124 ]] || ((took > most)) || ! grep -qF -- "$expected" <<<"$out"; then
    echo "FAIL $name: exit status $rc after $took s; expected a non-zero status and '$expected' within $most s"
    tail -n 30 <<<"$out"
    failures=$((failures + 1))
  else
    echo "ok   $name: exit status $rc after $took s: $(grep -F -m1 -- "$expected" <<<"$out")"
  fi
}

case_ rank_throws "train: rank 1 of 2: a failure injected on rank 1 (stopping every rank)" 120
case_ rank_throws_in_backward "train: rank 1 of 2: a failure injected in rank 1's backward (stopping every rank)" 120
case_ rank_killed "exited on signal 9" 120
# 2 s of timeout, 2 s for the answers to the watchdog's pings, the start and the end of the job.
case_ rank_stopped "data parallel: rank 1 of 2 has not answered for 2 s (stopped or hung); ending the job" 30
case_ rank0_stopped "data parallel: rank 0 of 2 has not answered for 2 s (stopped or hung); ending the job" 30 \
  GRAFT_COLLECTIVE_TIMEOUT=2
exit $((failures > 0))
