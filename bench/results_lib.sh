# The two helpers every side of `make bench` measures through: sourced by bench/torch_env.sh (so
# by run.sh and quality.sh), bench/ct2_bench.sh and bench/torch2.sh run alone. result reads RES
# (the results file), LOGS (the runs' stderr) and START (the run's start, in seconds).

# field JSON NAME: the numeric field NAME of a RESULT line's JSON.
field() { sed -n "s/.*\"$2\": *\\([0-9.eE+-]*\\).*/\\1/p" <<<"$1"; }

# result SIDE CMD...: runs one measurement process and appends its RESULT line to RES as
# "SIDE {json}"; a run without one is reported (its stderr is in LOGS) and skipped.
result() {
  local side=$1; shift
  local line
  if ! line=$("$@" 2>>"$LOGS" | grep '^RESULT ' | tail -1); then
    echo "bench: FAILED: $* (see $LOGS)" >&2
    return 0
  fi
  echo "$side ${line#RESULT }" >>"$RES"
  echo "  [$(( $(date +%s) - START ))s] $side $*: ${line#RESULT }" | cut -c1-220 >&2
}
