"""Merges the two driver runs (see build.sh) into one JSON line per case on stdout."""
import json, sys

KEEP = {
    "quant": {"q8_0_fast", "q8_0_ref_off", "q8_1_fast", "q8_1_ref_off", "q8_k_fast", "q8_k_off"},
    "dot": {"generic_off", "simd_fast", "dequant_off"},
    "fdot": {"simd_fast"},
}
fast = [json.loads(l) for l in open(sys.argv[1])]
off = [json.loads(l) for l in open(sys.argv[2])]
assert len(fast) == len(off)
for a, b in zip(fast, off):
    out = {k: v for k, v in a.items() if not k.endswith("_fast")}
    assert all(b[k] == v for k, v in out.items()), "inputs differ between builds"
    both = {**a, **b}
    for k in sorted(KEEP[a["kind"]]):
        if k == "dequant_off" and a["row"] != 0:
            continue
        out[k] = both[k]
    # the x86 quantizers use intrinsics only: contraction must not change them
    for k in ("q8_0", "q8_1"):
        if a["kind"] == "quant":
            assert a[k + "_fast"] == b[k + "_off"], k
    if a["kind"] == "dot":
        assert a["dequant_fast"] == b["dequant_off"], "dequantizers are contraction-free"
    print(json.dumps(out, separators=(",", ":")))
