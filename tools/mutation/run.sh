#!/usr/bin/env bash
# Mutation testing of training/forest.py, training/advantages.py, training/loss.py and
# ledger/admission.py with mutmut (docs/reliability.md, "Mutation check").
#
# mutmut names a mutant by its file's path, and the tests import these modules as
# grove.training.forest and grove.ledger.admission (the package-dir mapping of pyproject.toml), so
# the run works on a snapshot of the committed tree (git archive HEAD) in which each layer folder
# is moved under grove/. Edits in the working tree do not disturb a run, and a run never touches it.
# Usage: tools/mutation/run.sh [SNAPSHOT_DIR [MUTANT_NAME_PATTERN...]]
#   SNAPSHOT_DIR defaults to build/mutation; patterns (fnmatch, as `mutmut run` takes them) limit
#   the run to those mutants, e.g. 'grove.training.loss.*'. Results are printed at the end.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
snap=${1:-$root/build/mutation}
shift || true
rm -rf "$snap"
mkdir -p "$snap"
git -C "$root" archive HEAD | tar -x -C "$snap"
cd "$snap"
for layer in ledger storage capture training migrations; do mv "$layer" "grove/$layer"; done
cp "$root/tools/mutation/setup.cfg" setup.cfg
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
nice -n 10 "$root/.venv/bin/mutmut" run --max-children "${MUTMUT_CHILDREN:-2}" "$@" || true
"$root/.venv/bin/mutmut" results --all true > results.txt || "$root/.venv/bin/mutmut" results > results.txt
grep -c . results.txt || true
for module in forest advantages loss admission; do
    echo "$module: $(grep -c "\.$module\." results.txt || true) listed"
done
