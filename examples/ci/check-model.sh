#!/usr/bin/env bash
# CI gate for a model: inspect it, gate on gradient checks, diff both reports
# against the baselines committed in baseline/, and keep every report.
#
#   examples/ci/check-model.sh [OUT_DIR]     reports go to OUT_DIR (default hookcli-reports)
#   UPDATE=1 examples/ci/check-model.sh      rewrite the baselines after an intended change
#   HOOKCLI="python -m hookcli" ...          how to call hookcli (default: hookcli)
#
# Exit status: 0 when every check passed and nothing changed; else the worst
# hookcli status (1 check failed or the model changed, 2 usage, 3 not built, 4 raised).
# Defaults (inputs, --fail-on, tolerances) come from [tool.hookcli] in ./pyproject.toml.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-hookcli-reports}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
read -r -a hookcli <<< "${HOOKCLI:-hookcli}"
update=()
if [[ "${UPDATE:-0}" == 1 ]]; then update=(--update-baseline); fi
cd "$here"  # the model file, the baselines and the [tool.hookcli] table are here

status=0
step() {  # run one hookcli command, remember the worst exit status, go on
    local code=0
    "${hookcli[@]}" "$@" || code=$?
    if (( code > status )); then status=$code; fi
}

# 1. Shapes and parameter counts: any structural change fails against the baseline.
step inspect model.py:TinyClassifier --format json --output "$out/inspect.json" \
    --baseline baseline/inspect.json "${update[@]}" --junit "$out/inspect.xml"

# 2. Gradient flow: fail on NaN/Inf/unused/zero grads or a grad norm over 1000,
#    and on gradients that moved beyond rtol 1e-4 from the baseline.
step grads model.py:TinyClassifier --format json --output "$out/grads.json" \
    --baseline baseline/grads.json "${update[@]}" --junit "$out/grads.xml"

# 3. A readable record of what moved (loss and total grad norm) for the artifacts.
if [[ -f "$out/grads.json" && ${#update[@]} -eq 0 ]]; then
    "${hookcli[@]}" diff baseline/grads.json "$out/grads.json" --only loss,grad_norm \
        --rtol 1e-4 --atol 1e-6 --format markdown --output "$out/grads-diff.md" || true
fi

echo "hookcli reports in $out (exit status $status)" >&2
exit "$status"
