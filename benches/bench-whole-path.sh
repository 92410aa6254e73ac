#!/usr/bin/env bash
# The whole path per line, in one run: the library path and the bare serde parse floor
# (benches/whole_path.rs), the command line (`silpgate silp compile/decode --lines`) on the
# same 20,000 lines, and the Python reference doing the same work.
#
#   bash benches/bench-whole-path.sh REFERENCE_CHECKOUT
#
# REFERENCE_CHECKOUT is a checkout of the SILP reference implementation (github.com/
# Juwan-Hwang/polyglotir, not part of this project). Its one runtime dependency, pydantic, is
# installed into a venv under the cargo target directory.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(realpath "${1:?usage: bench-whole-path.sh REFERENCE_CHECKOUT}")
target=${CARGO_TARGET_DIR:-target}
lines=$(mktemp -d)
trap 'rm -rf "$lines"' EXIT

cargo build --release --quiet --bin silpgate
cargo bench --quiet --bench whole_path -- --write-lines "$lines" | tee "$lines/library.md"

echo
echo "command line (silpgate silp ... --lines), per line, best of 3"
for row in "compile code compile.jsonl" "compile json compile.jsonl" "decode code decode-code.jsonl" \
    "decode json decode-json.jsonl"; do
    set -- $row
    best=
    for _ in 1 2 3; do
        start=$(date +%s%N)
        "$target/release/silpgate" silp "$1" --frontend "$2" --lines "$lines/$3" > /dev/null
        took=$(( $(date +%s%N) - start ))
        if [ -z "$best" ] || [ "$took" -lt "$best" ]; then best=$took; fi
    done
    n=$(wc -l < "$lines/$3")
    awk -v name="$1, $2" -v ns="$best" -v n="$n" 'BEGIN { printf "| %s | %.2f µs |\n", name, ns / n / 1000 }'
done | tee "$lines/cli.md"

venv="$target/whole-path-reference-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "pydantic==2.14.4"
fi
echo
echo "reference ($("$venv/bin/python" --version), pydantic $("$venv/bin/python" -c 'import pydantic; print(pydantic.VERSION)'))"
"$venv/bin/python" benches/whole_path_reference.py "$checkout" "$lines" | tee "$lines/reference.md"

# One table: each row's figures side by side (cells are "| name | x µs | ...").
echo
echo "| per line | silpgate CLI | library path | bare serde parse | reference | reference / CLI | CLI / bare parse |"
echo "|---|---|---|---|---|---|---|"
awk -F' *[|] *' '
    FILENAME ~ /library/ && $3 ~ /µs/ { lib[$2] = $3 + 0; bare[$2] = $4 + 0 }
    FILENAME ~ /cli/ { cli[$2] = $3 + 0 }
    FILENAME ~ /reference/ { ref[$2] = $3 + 0; order[++n] = $2 }
    END { for (i = 1; i <= n; i++) { k = order[i]
        printf "| %s | %.2f µs | %.2f µs | %.3f µs | %.1f µs | %.1fx | %.1fx |\n",
            k, cli[k], lib[k], bare[k], ref[k], ref[k] / cli[k], cli[k] / bare[k] } }
' "$lines/library.md" "$lines/cli.md" "$lines/reference.md"
