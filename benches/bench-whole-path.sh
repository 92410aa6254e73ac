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

venv="$target/whole-path-reference-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "pydantic==2.14.4"
fi
# The two implementations do not succeed on the same lines: their readers differ.
# A failed line is timed like a success, so both are timed on the lines they agree on.
"$venv/bin/python" benches/whole_path_reference.py "$checkout" "$lines" --answers
echo
for row in "compile code compile.jsonl" "compile json compile.jsonl" "decode code decode-code.jsonl" \
    "decode json decode-json.jsonl"; do
    set -- $row
    slug="$1-$2"
    "$target/release/silpgate" silp "$1" --frontend "$2" --lines "$lines/$3" |
        sed 's/^{"ok".*/ok/; s/^{"error".*/error/' > "$lines/$slug.silpgate"
    paste -d '\t' "$lines/$slug.silpgate" "$lines/$slug.reference" "$lines/$3" |
        awk -F '\t' -v agreed="$lines/$slug.agreed" -v name="$1, $2" '
            $1 == $2 { print $3 > agreed; next }
            $1 == "ok" { ours++ } $2 == "ok" { theirs++ }
            END { printf "%s: %d lines left out, answered ok only by silpgate %d, only by the reference %d\n",
                name, ours + theirs, ours, theirs }'
done

echo
echo "command line (silpgate silp ... --lines), per line, best of 3, on the lines both agree on"
for row in "compile code" "compile json" "decode code" "decode json"; do
    set -- $row
    file="$lines/$1-$2.agreed"
    best=
    for _ in 1 2 3; do
        start=$(date +%s%N)
        "$target/release/silpgate" silp "$1" --frontend "$2" --lines "$file" > "$lines/answers"
        took=$(( $(date +%s%N) - start ))
        if [ -z "$best" ] || [ "$took" -lt "$best" ]; then best=$took; fi
    done
    n=$(wc -l < "$file")
    awk -v name="$1, $2" -v ns="$best" -v n="$n" 'BEGIN { printf "| %s | %.2f µs |\n", name, ns / n / 1000 }'
    ok=$(grep -c '^{"ok"' "$lines/answers" || true)
    echo "counts $1, $2: ok $ok error $(( n - ok ))" >> "$lines/cli.counts"
done | tee "$lines/cli.md"

echo
echo "reference ($("$venv/bin/python" --version), pydantic $("$venv/bin/python" -c 'import pydantic; print(pydantic.VERSION)'))"
"$venv/bin/python" benches/whole_path_reference.py "$checkout" "$lines" 2> "$lines/reference.counts" |
    tee "$lines/reference.md"
if ! diff "$lines/cli.counts" "$lines/reference.counts" > "$lines/counts.diff"; then
    echo "bench-whole-path.sh: silpgate and the reference did not answer the same lines with ok and" \
        "error, so their times are not of the same work:" >&2
    cat "$lines/counts.diff" >&2
    exit 1
fi
echo "both answered the same lines: $(tr '\n' ';' < "$lines/cli.counts")"

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
