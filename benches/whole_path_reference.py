"""The whole path in the SILP reference implementation, per line, over the input files
benches/whole_path.rs writes: json.loads + validate + compile + json.dumps (compile), and
json.loads + decode + json.dumps (decode), each line answered with {"ok": ..} or {"error": ..}.

Usage: python whole_path_reference.py CHECKOUT LINES_DIR [--answers]
CHECKOUT is a checkout of the reference repository (not part of this project); its `src`
directory is put on the import path. With --answers, writes whether each line was answered ok
or with an error (`<workload>.reference`), untimed: benches/bench-whole-path.sh keeps the lines
on which the reference and silpgate agree (`<workload>.agreed`), so that both are timed doing
the same work. Without, it times those lines and prints one table row per workload: the best over rounds
of the per-line time, in microseconds (on a shared machine the best round is the one least
disturbed by other work). On standard error, one line per workload, `counts NAME: ok N error
M`: a failure is timed like a success, so benches/bench-whole-path.sh compares these counts
with silpgate's and fails when they differ.
"""

import json
import sys
import time

ROUNDS = 5


def main() -> None:
    checkout, lines_dir = sys.argv[1], sys.argv[2]
    answers_only = sys.argv[3:] == ["--answers"]
    sys.path.insert(0, f"{checkout}/src")
    from silp.frontend import get_frontend
    from silp.ir import validate

    def compile_each(frontend):
        fe = get_frontend(frontend)

        def each(line):
            try:
                result = validate(json.loads(line))
                if not result.valid:
                    return json.dumps({"error": {"code": "decode_failed", "message": "; ".join(result.errors)}})
                return json.dumps({"ok": fe.compile(result.ir)}, ensure_ascii=False)
            except Exception as e:  # the reference raises on malformed input
                return json.dumps({"error": {"code": "decode_failed", "message": str(e)}})

        return each

    def decode_each(frontend):
        fe = get_frontend(frontend)

        def each(line):
            try:
                ir = fe.decode(json.loads(line))
                return '{"ok":' + ir.model_dump_json(exclude_none=True) + "}"
            except Exception as e:
                return json.dumps({"error": {"code": "decode_failed", "message": str(e)}})

        return each

    # (name, the file benches/whole_path.rs writes, the file of the lines both sides agree on)
    workloads = [
        ("compile, code", "compile.jsonl", "compile-code.agreed", compile_each("code")),
        ("compile, json", "compile.jsonl", "compile-json.agreed", compile_each("json")),
        ("decode, code", "decode-code.jsonl", "decode-code.agreed", decode_each("code")),
        ("decode, json", "decode-json.jsonl", "decode-json.agreed", decode_each("json")),
    ]
    if answers_only:
        for _, written, agreed, each in workloads:
            with open(f"{lines_dir}/{written}", encoding="utf-8") as f:
                lines = f.read().splitlines()
            with open(f"{lines_dir}/{agreed.replace('.agreed', '.reference')}", "w", encoding="utf-8") as out:
                for line in lines:
                    out.write("ok\n" if each(line).startswith('{"ok"') else "error\n")
        return
    for name, _, agreed, each in workloads:
        with open(f"{lines_dir}/{agreed}", encoding="utf-8") as f:
            lines = f.read().splitlines()
        rounds = []
        for _ in range(ROUNDS):
            out = []
            start = time.perf_counter()
            for line in lines:
                out.append(each(line))
            rounds.append((time.perf_counter() - start) / len(lines))
        print(f"| {name} | {min(rounds) * 1e6:.2f} µs |")
        ok = sum(1 for answer in out if answer.startswith('{"ok"'))
        print(f"counts {name}: ok {ok} error {len(out) - ok}", file=sys.stderr)


if __name__ == "__main__":
    main()
