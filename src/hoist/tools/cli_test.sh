#!/usr/bin/env bash
# End-to-end test of the hoist CLI: demo, ls, inspect, verify, export, import,
# rm, plan, and exit codes on good and corrupted checkpoints and on bad flags.
# Usage: cli_test.sh PATH_TO_HOIST
set -euo pipefail
hoist=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "cli_test: FAILED: $*" >&2; exit 1; }

"$hoist" --help | grep -q demo || fail "--help lists no demo"

"$hoist" demo --size 8MiB --vocab 512 --steps 4 --save-every 1 --keep 3 \
  --step-time 0ms --root "$dir/r" --trace "$dir/trace.json" --json \
  --metrics "$dir/metrics.jsonl" >"$dir/demo.json" || fail "demo exit"
for track in '"device 0"' '"device 7"' '"writer data/r00000_w00.bin"' \
  '"commit"' '"phases"' '"save staging (step 4)"' '"traceEvents"'; do
  grep -q "$track" "$dir/trace.json" || fail "trace lacks $track"
done
grep -q '"verified": true' "$dir/demo.json" || fail "demo not verified"
grep -q '"blocked_s"' "$dir/demo.json" || fail "demo json lacks blocked_s"
python3 - "$dir/demo.json" <<'PY' || fail "demo json lacks its prediction"
import json, sys
demo = json.load(open(sys.argv[1]))
for key in ("predicted_blocked_s", "predicted_save_s"):
    assert isinstance(demo[key], float), (key, demo)
for key in ("d2h_gbps", "host_gbps", "write_gbps", "commit_s"):
    assert isinstance(demo["prediction"][key], float), (key, demo["prediction"])
for mode in demo["modes"].values():
    assert isinstance(mode["dispatch_s"], float), mode
PY
python3 - "$dir/metrics.jsonl" <<'PY' || fail "demo --metrics records"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
saves = [r for r in records if r["kind"] == "save"]
assert sorted({r["step"] for r in saves}) == [1, 2, 3, 4], records
for step in (1, 2, 3, 4):
    mine = [r for r in saves if r["step"] == step]
    assert [r["phase"] for r in mine] == ["planning", "queued", "staging",
        "write", "hash", "commit", "retention"], mine
    assert abs(sum(r["seconds"] for r in mine) - mine[0]["elapsed_s"]) < 1e-4
assert any(r["kind"] == "restore" and r["phase"] == "verify" for r in records)
PY
# diff: steps 3 and 4 of the demo differ (its training changes the arrays);
# a step against itself in none; the JSON has the keys scripts read.
"$hoist" diff "$dir/r" 3 4 --json >"$dir/diff.json" || fail "diff"
python3 - "$dir/diff.json" <<'PY' || fail "diff json"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["added"] == [] and d["removed"] == [] and len(d["changed"]) > 40, d
assert all("name" in c and c["changed_extents"] for c in d["changed"]), d
PY
"$hoist" diff "$dir/r" 4 "$dir/r" 4 | grep -q "0 changed, 0 added, 0 removed" ||
  fail "diff of a step with itself"
expect_diff_error() {
  if "$hoist" diff "$@" 2>"$dir/diff.err"; then fail "diff $*: exit 0"; fi
}
expect_diff_error "$dir/r" 3
grep -q "ARGS" "$dir/diff.err" || fail "diff with two arguments: text"
expect_diff_error "$dir/r" 3 x
grep -q "'x' is not a step number" "$dir/diff.err" || fail "diff step text"
# A step copied out of its root: verify says what it is.
cp -r "$dir/r/step_00000004" "$dir/copied-step"
if "$hoist" verify "$dir/copied-step" 2>"$dir/copied.err"; then
  fail "verify of a copied step passed"
fi
grep -q "is not a step directory inside a root" "$dir/copied.err" ||
  fail "verify of a copied step: text"
rm -rf "$dir/copied-step"
# Progress goes to stderr (python/tests/test_observability.py watches a
# 1 GiB verify on a terminal and in a log); --quiet prints none.
"$hoist" -q verify "$dir/r" --progress-every 0.001 >/dev/null 2>"$dir/q.err" ||
  fail "verify --quiet"
[ ! -s "$dir/q.err" ] || fail "--quiet printed progress"
ls -a "$dir" | grep -q hoist-rates && fail "demo left its rate measurement"
"$hoist" demo --size 8MiB --vocab 512 --steps 2 --save-every 1 \
  --step-time 0ms --root "$dir/not/yet/made/r" >/dev/null ||
  fail "demo into a root whose parents do not exist"
rm -rf "$dir/not"
"$hoist" demo --size 8MiB --vocab 512 --steps 2 --save-every 1 \
  --step-time 0ms --root "$dir/np" --no-predict --json >"$dir/np.json" ||
  fail "demo --no-predict"
grep -q '"predicted_save_s": null' "$dir/np.json" || fail "--no-predict predicted"
rm -rf "$dir/np"

"$hoist" ls "$dir/r" --json >"$dir/ls.json"
steps=$(python3 -c 'import json, sys
print(" ".join(str(e["step"]) for e in json.load(open(sys.argv[1]))
               if e.get("state") == "committed"))' "$dir/ls.json")
[ "$steps" = "2 3 4" ] || fail "ls lists committed steps '$steps', not '2 3 4'"

"$hoist" inspect "$dir/r/step_00000004" --json | grep -q '"format": "hoist/2"' ||
  fail "inspect"
"$hoist" verify "$dir/r/step_00000004" >/dev/null || fail "verify of a good step"
# A root: its newest step, named.
"$hoist" verify "$dir/r" >"$dir/verify-root.txt" || fail "verify of a root"
grep -q "(step 4): OK" "$dir/verify-root.txt" || fail "verify of a root's step"

# Export to safetensors: one file, then shards with an index; the files
# parse (header length, JSON, offsets tiling the data) and the step's bytes
# all arrive; a second export into the same directory is refused.
"$hoist" export "$dir/r/step_00000004" "$dir/hf" --json >"$dir/export.json" ||
  fail "export"
"$hoist" export "$dir/r" "$dir/hf2" --max-shard-size 1MiB --memory 1MiB \
  >/dev/null || fail "sharded export"
python3 - "$dir" <<'PY' || fail "export files do not parse"
import json, os, struct, sys
d = sys.argv[1]
exported = json.load(open(f"{d}/export.json"))
def tensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    assert meta["format"] == "pt" and len(json.loads(meta["hoist.xxh3"])) == len(header)
    spans = sorted(tuple(e["data_offsets"]) for e in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    return len(header), spans[-1][1]
count, size = tensors(f"{d}/hf/model.safetensors")
assert count == exported["tensors"] and size == exported["bytes"]
index = json.load(open(f"{d}/hf2/model.safetensors.index.json"))
files = sorted(set(index["weight_map"].values()))
assert len(files) > 1 and index["metadata"]["total_size"] == size
assert sum(tensors(f"{d}/hf2/{f}")[0] for f in files) == count
PY
if "$hoist" export "$dir/r/step_00000004" "$dir/hf" 2>"$dir/export.err"; then
  fail "export over an earlier export"
fi
grep -q "already holds an export" "$dir/export.err" || fail "export refusal text"

# Import the sharded export back: a committed, verified step of as many
# arrays; a truncated file is refused with the reason and makes no root.
"$hoist" import "$dir/hf2" "$dir/imported" 9 --json >"$dir/import.json" ||
  fail "import"
python3 -c 'import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["arrays"] == b["tensors"] and a["bytes"] == b["bytes"], (a, b)' \
  "$dir/import.json" "$dir/export.json" || fail "import figures"
"$hoist" verify "$dir/imported/step_00000009" >/dev/null || fail "verify import"
# Deltas: the same file imported again as step 10 references step 9's
# bytes; once step 9 is removed its directory stays as a referenced step
# (ls says so), and step 10 still inspects, verifies and exports whole.
"$hoist" import "$dir/hf2" "$dir/imported" 10 >/dev/null || fail "import again"
"$hoist" inspect "$dir/imported/step_00000010" --json >"$dir/inspect10.json"
python3 -c 'import json, sys
i, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert i["written_bytes"] == 0 and i["referenced_bytes"] == b["bytes"], i'   "$dir/inspect10.json" "$dir/export.json" || fail "inspect of a delta step"
"$hoist" rm "$dir/imported" 9 >/dev/null || fail "rm of a referenced step"
"$hoist" ls "$dir/imported" >"$dir/ls-delta.txt" || fail "ls of a delta root"
grep -q "referenced (pruned" "$dir/ls-delta.txt" || fail "ls shows no referenced step"
"$hoist" verify "$dir/imported/step_00000010" >/dev/null || fail "verify delta"
"$hoist" export "$dir/imported" "$dir/hf3" --json >"$dir/export3.json" ||
  fail "export of a delta step"
python3 - "$dir/hf/model.safetensors" "$dir/hf3/model.safetensors" <<'PY' ||
import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__")
    return {k: (v["dtype"], v["shape"],
                data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a == b, sorted(set(a) ^ set(b))[:5]
PY
  fail "a delta step exports other tensors"
"$hoist" rm "$dir/imported" 10 >/dev/null || fail "rm of the last step"
[ -z "$(ls "$dir/imported" | grep step_)" ] || fail "rm left referenced data"
head -c 20 "$dir/hf/model.safetensors" >"$dir/cut.safetensors"
if "$hoist" import "$dir/cut.safetensors" "$dir/nothing" 1 2>"$dir/import.err"; then
  fail "import of a truncated file"
fi
grep -q "runs past the file" "$dir/import.err" || fail "import refusal text"
[ ! -e "$dir/nothing" ] || fail "a refused import made a root"

# A truncated data file: verify exits 1 and says why.
truncate -s 100 "$dir/r/step_00000004/data/r00000_w00.bin"
if "$hoist" verify "$dir/r/step_00000004" >"$dir/verify.txt"; then
  fail "verify passed a truncated file"
fi
grep -q "truncated" "$dir/verify.txt" || fail "verify did not say truncated"

# A garbage manifest: inspect and verify fail with the reason.
echo "garbage" >"$dir/r/step_00000003/MANIFEST.json"
if "$hoist" inspect "$dir/r/step_00000003" 2>"$dir/inspect.err"; then
  fail "inspect read a garbage manifest"
fi
grep -q "not valid JSON" "$dir/inspect.err" || fail "inspect error text"
if "$hoist" verify "$dir/r/step_00000003" >/dev/null; then
  fail "verify passed a garbage manifest"
fi

if "$hoist" verify "$dir/no-such-step" 2>"$dir/missing.err"; then
  fail "verify passed a missing directory"
fi
grep -q "no-such-step: no such root" "$dir/missing.err" ||
  fail "verify missing text"
mkdir "$dir/empty-root"
if "$hoist" verify "$dir/empty-root" 2>"$dir/empty.err"; then
  fail "verify passed a root without steps"
fi
grep -q "neither a step directory nor a root with a committed step" \
  "$dir/empty.err" || fail "verify of a root without steps: text"

"$hoist" rm "$dir/r" 2 >/dev/null || fail "rm"
# Step 3's manifest is garbage now: what it references is unknown, so step
# 2's data files stay (docs/delta.md); step 2 is no checkpoint any more.
[ ! -e "$dir/r/step_00000002/MANIFEST.json" ] || fail "rm left the step"
"$hoist" ls "$dir/r" | grep -q "^2 .*committed" && fail "rm: step 2 listed"
if "$hoist" rm "$dir/r" 2 2>/dev/null; then fail "rm of a missing step"; fi

# Hostile roots: every reader exits 1 with the reason, within seconds
# (timeout's 124 would mean a hang, 128+N a signal), and nothing outside the
# root is touched.
expect_exit1() {  # expect_exit1 TEXT COMMAND...: exit status 1, TEXT said
  local text=$1 rc=0
  shift
  timeout 20 "$@" >"$dir/out.txt" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || fail "$* exited $rc, not 1: $(head -c 300 "$dir/out.txt")"
  grep -q -- "$text" "$dir/out.txt" || fail "$* did not say '$text'"
}
h="$dir/hostile"
mkdir -p "$h/step_00000001"
python3 -c 'import sys
sys.stdout.write("{\"format\": \"hoist/1\", \"step\": 1, \"arrays\": [], "
                 "\"metadata\": {\"x\": " + "[" * 100000 + "]" * 100000 + "}}")' \
  >"$h/step_00000001/MANIFEST.json"
expect_exit1 "nests deeper" "$hoist" inspect "$h/step_00000001"
expect_exit1 "nests deeper" "$hoist" verify "$h/step_00000001"
timeout 20 "$hoist" ls "$h" | grep -q "unreadable" || fail "ls of a deep manifest"

mkdir -p "$h/step_00000002"
mkfifo "$h/step_00000002/MANIFEST.json"
expect_exit1 "not a regular file" "$hoist" inspect "$h/step_00000002"
expect_exit1 "not a regular file" "$hoist" verify "$h/step_00000002"
timeout 20 "$hoist" ls "$h" >/dev/null || fail "ls hung or failed on a FIFO"

cp -r "$dir/r/step_00000004" "$h/step_00000007"
expect_exit1 "manifest is of step 4" "$hoist" verify "$h/step_00000007"

echo "not a lock" >"$dir/precious"
ln -s "$dir/precious" "$h/.hoist.lock"
expect_exit1 "symbolic link" "$hoist" rm "$h" 7
[ "$(cat "$dir/precious")" = "not a lock" ] || fail "rm wrote through a link"
[ -d "$h/step_00000007" ] || fail "rm removed a step it had no lock for"

# plan --json: every rule's figures, with the time the plan took.
"$hoist" plan --mesh 3x4 --processes 3 --json >"$dir/plan.json" || fail "plan"
python3 - "$dir/plan.json" <<'PY' || fail "plan --json lacks a rule's plan_s"
import json, sys
rules = json.load(open(sys.argv[1]))["rules"]
assert sorted(rules) == ["balanced", "orbax", "single"], rules
for rule in rules.values():
    assert isinstance(rule["plan_s"], float) and rule["plan_s"] >= 0, rule
    assert rule["slices"] > 0, rule
PY

# plan --predict: each rule's blocked time and time to durable.
"$hoist" plan --mesh 3x4 --processes 3 --predict --disk-gbps 2 --json \
  >"$dir/predict.json" || fail "plan --predict"
python3 - "$dir/predict.json" <<'PY' || fail "plan --predict figures"
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["rates"]["write_gbps"] == 2, plan["rates"]
rules = plan["rules"]
for rule in rules.values():
    assert 0 < rule["predicted_blocked_s"] <= rule["predicted_save_s"], rule
# One replica saving every replicated box is the slowest way.
assert (rules["single"]["predicted_save_s"] >
        rules["balanced"]["predicted_save_s"]), rules
PY
if "$hoist" plan --predict --disk-gbps 0 2>/dev/null; then fail "--disk-gbps 0"; fi

# Bad flags and bad input exit non-zero with a message.
if "$hoist" demo --steps 0 --root "$dir/x" 2>/dev/null; then fail "--steps 0"; fi
# A model this host cannot hold is refused before anything is allocated
# (not killed by the OOM killer at the restore), and no root is made.
expect_exit1 "of host memory at its peak" \
  "$hoist" demo --size 1TiB --no-predict --root "$dir/huge"
[ -e "$dir/huge" ] && fail "the refused demo made its root"
if "$hoist" plan --mesh 3x 2>/dev/null; then fail "--mesh 3x"; fi
# A bad command line exits 1 (not CLI11's own codes) and says what is wrong;
# --help and --version exit 0.
expect_exit1 "unknown command 'nonsense' (commands: demo, plan" \
  "$hoist" nonsense
expect_exit1 "ROOT is required" "$hoist" ls
expect_exit1 "not expected: --nope" "$hoist" inspect "$dir/r" --nope
expect_exit1 "Could not convert: STEP = two" "$hoist" rm "$dir/r" two
expect_exit1 "STEP: -1: must be 0 or more" "$hoist" rm "$dir/r" -1
expect_exit1 "STEP: -1: must be 0 or more" "$hoist" import "$dir/hf" "$dir/i" -1
expect_exit1 "--keep: -2: must be 0 or more" "$hoist" demo --keep -2
"$hoist" --help >/dev/null || fail "--help"
"$hoist" export --help >/dev/null || fail "export --help"
# The version is CMakeLists.txt's project(VERSION), the one place it is set.
version=$(sed -n 's/^project(hoist VERSION \([0-9.]*\) .*/\1/p' \
  "$(dirname "$0")/../../../CMakeLists.txt")
[[ -n "$version" ]] || fail "no version in CMakeLists.txt"
[[ "$("$hoist" --version)" == "hoist $version" ]] || fail "--version"
touch "$dir/a-file"
expect_exit1 "a-file is not a directory" "$hoist" export "$dir/r" "$dir/a-file"

echo "cli_test: 1 passed, 0 failed"
