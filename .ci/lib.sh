# shellcheck shell=bash
# Shared by .ci/run and .ci/matrix (sourced, not run): time budgets per step, the
# summary table, and finding a Python by its version.

# Under CI=true nothing may be left out: a Python or a server that cannot be found fails
# the run. Elsewhere (a developer's machine) it is reported as "absent" in the summary,
# loudly, and the rest still runs.
STRICT=false
if [ "${CI:-}" = "true" ]; then STRICT=true; fi

# One row per step: name, outcome, seconds taken, budget; printed by `summary` at the end
# by whoever made the file (.ci/run, or .ci/matrix run alone), and removed on exit.
OWN_SUMMARY=false
if [ -z "${CI_SUMMARY:-}" ]; then
  CI_SUMMARY=$(mktemp)
  OWN_SUMMARY=true
  trap 'rm -f "$CI_SUMMARY"' EXIT
fi
export CI_SUMMARY

# step NAME BUDGET CMD [ARGS...]: run CMD (a program, or a function exported with
# `export -f`, run with `set -euo pipefail`) under a time budget in seconds: past it, CMD gets SIGTERM, and SIGKILL
# 20 s later. Records a row; returns CMD's status (124 when over budget).
step() {
  local name=$1 budget=$2 start=$SECONDS rc=0 outcome=pass
  shift 2
  echo
  echo "== $name (budget ${budget}s)"
  if [ "$(type -t "$1")" = function ]; then
    timeout --kill-after=20 "$budget" bash -c 'set -euo pipefail; "$@"' step "$@" || rc=$?
  else
    timeout --kill-after=20 "$budget" "$@" || rc=$?
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    outcome="OVER BUDGET"
  elif [ "$rc" -ne 0 ]; then
    outcome="FAIL (exit $rc)"
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$outcome" "$((SECONDS - start))" "$budget" >>"$CI_SUMMARY"
  return "$rc"
}

# absent NAME WHY: a part that could not run. A failure under CI=true, a row otherwise.
absent() {
  echo "!! $1: $2" >&2
  if $STRICT; then
    printf '%s\t%s\t0\t-\n' "$1" "FAIL (absent: $2)" >>"$CI_SUMMARY"
    return 1
  fi
  printf '%s\t%s\t0\t-\n' "$1" "ABSENT: $2" >>"$CI_SUMMARY"
}

# summary: print the table; exit status 1 when any row failed or ran over its budget.
summary() {
  echo
  echo "== Summary"
  awk -F'\t' '
    { rows[NR] = $0; if (length($1) > w) w = length($1); if (length($2) > v) v = length($2) }
    END {
      printf "%-" w "s  %-" v "s  %8s  %6s\n", "step", "outcome", "seconds", "budget"
      for (i = 1; i <= NR; i++) {
        split(rows[i], f, "\t")
        printf "%-" w "s  %-" v "s  %8s  %6s\n", f[1], f[2], f[3], f[4]
      }
    }' "$CI_SUMMARY"
  ! grep -qP '\t(FAIL|OVER BUDGET)' "$CI_SUMMARY"
}

# find_python X.Y: print the path of a Python X.Y interpreter, from pyenv (the command,
# or $PYENV_ROOT, or ~/.pyenv) or else pythonX.Y on PATH; status 1 when there is none.
find_python() {
  local want=$1 pyenv root prefix candidate
  local -a candidates=()
  pyenv=$(command -v pyenv || true)
  root=${PYENV_ROOT:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.pyenv}
  if [ -z "$pyenv" ] && [ -x "$root/bin/pyenv" ]; then pyenv=$root/bin/pyenv; fi
  if [ -n "$pyenv" ] && prefix=$("$pyenv" prefix "$want" 2>/dev/null); then
    candidates+=("$prefix/bin/python$want")
  fi
  # Without the command, the newest patch release installed under the pyenv root.
  while IFS= read -r candidate; do candidates+=("$candidate"); done < <(
    ls -d "$root/versions/$want".*/bin/"python$want" 2>/dev/null | sort -V -r
  )
  if command -v "python$want" >/dev/null; then candidates+=("$(command -v "python$want")"); fi
  for candidate in "${candidates[@]}"; do
    if [ -x "$candidate" ] && [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
