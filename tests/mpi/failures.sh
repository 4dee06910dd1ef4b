#!/usr/bin/env bash
# A rank that throws (in its loss, or in its backward with gradient sums in flight), or is killed
# with SIGKILL, in the middle of data-parallel training ends the whole job with a non-zero exit
# status and a message naming the cause, within two minutes (never a hang: rank 0 is waiting for
# it in a sum at the time).
#   tests/mpi/failures.sh MPIEXEC TEST_MPI
set -uo pipefail
here=$(dirname "$0")
mpiexec=$1 test=$2
failures=0

# case_ NAME EXPECTED: runs failures/NAME of test_mpi on 2 ranks.
case_() {
  local start=$SECONDS out rc
  out=$(timeout 120 bash "$here/mpirun.sh" "$mpiexec" 2 "$test" --run_test="failures/$1" 2>&1)
  rc=$?
  if [[ $rc == 0 || $rc == 124 ]] || ! grep -qF -- "$2" <<<"$out"; then
    echo "FAIL $1: exit status $rc after $((SECONDS - start)) s; expected a non-zero status and '$2'"
    tail -n 30 <<<"$out"
    failures=$((failures + 1))
  else
    echo "ok   $1: exit status $rc after $((SECONDS - start)) s: $(grep -F -m1 -- "$2" <<<"$out")"
  fi
}

case_ rank_throws "train: rank 1 of 2: a failure injected on rank 1 (stopping every rank)"
case_ rank_throws_in_backward "train: rank 1 of 2: a failure injected in rank 1's backward (stopping every rank)"
case_ rank_killed "exited on signal 9"
exit $((failures > 0))
