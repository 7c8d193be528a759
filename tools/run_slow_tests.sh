#!/usr/bin/env bash
# `make test-slow`: every test file under DIR that marks a test slow, each in its own pytest process (vLLM
# scans every loaded module when an engine starts and trips over objects other tests' imports leave behind,
# numba's llvmlite wrappers, so engines start in processes that ran nothing else first). Every file runs,
# also after a failure; a summary names each failing file. Exit 0 when each file passed or collected no slow
# test (pytest's exit code 5), else 1.
#
#     tools/run_slow_tests.sh PYTHON [DIR]    (DIR: tests)
set -u
python=$1
dir=${2:-tests}
mapfile -t files < <(grep -rlE "pytest.mark.slow" "$dir" --include='test_*.py' | sort)
failed=()
for f in "${files[@]}"; do
    echo "== $f"
    "$python" -m pytest -q -m slow "$f"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
        failed+=("$f (exit $rc)")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "== ${#failed[@]} of ${#files[@]} slow test files failed:"
    printf '   %s\n' "${failed[@]}"
    exit 1
fi
echo "== all ${#files[@]} slow test files passed"
