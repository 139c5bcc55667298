"""The expert-parallel all-to-all against a published measurement the cost model never saw.

    python bench/moe_dispatch.py

Source: NVIDIA, "Scalable Training of Mixture-of-Experts Models with Megatron Core" (arXiv:2603.07685,
2026), sec. 4.2.2, Table 7: latency of one token dispatch and one combine, standard all-to-all and
HybridEP, on GB200 (NVL72) and H100 (8-GPU nodes on InfiniBand), hidden size 7168, sequence length 4096,
256 experts, EP 8 to 64; "the table reports communication latency only". What the table does not state and
is assumed here: DeepSeek-V3's top-8 routing (the hidden size and expert count are DeepSeek-V3's), one
sequence per GPU, bf16 tokens. Each GPU then sends its 4096 x 8 routed copies of 7168 bf16 values, the
volume ``layer_cost`` passes to ``collective_time("all-to-all", ...)`` for one dispatch (and one combine).
HybridEP sends each token over the network once per destination node, not once per expert, and inside a node
once per destination GPU; the cost model prices that where a program runs Megatron's flex dispatcher
(``Software.ep_dispatch``, ``collectives.deduplicated_all_to_all_time``: DeepSeek-V3's 256 experts, uniform
routing), and its columns compare it with the table's HybridEP latencies.

A benchmark, not a test: it prints the table and asserts nothing.
"""
from __future__ import annotations

from meshplan.cost_model import Cluster, collective_time
from meshplan.cost_model.collectives import deduplicated_all_to_all_time

HIDDEN, SEQ, TOP_K, BYTES, EXPERTS = 7168, 4096, 8, 2, 256

# EP size -> (HybridEP dispatch, all-to-all dispatch, HybridEP combine, all-to-all combine), microseconds
TABLE_7 = {
    "gb200-nvl72": {8: (391, 735, 353, 741), 16: (578, 743, 527, 765), 32: (612, 769, 646, 758),
                    64: (675, 930, 744, 827)},
    "h100-sxm": {8: (661, 1265, 624, 1277), 16: (1485, 5774, 1688, 5628), 32: (3064, 8059, 3088, 7815),
                 64: (4626, 9164, 4398, 8727)},
}


def main() -> int:
    routed = SEQ * TOP_K * HIDDEN * BYTES
    print(f"one dispatch: {SEQ} tokens x top-{TOP_K} x {HIDDEN} x {BYTES} B = {routed / 1e6:.0f} MB per GPU\n")
    print(f"{'preset':<13} {'EP':>3} {'ours us':>8} {'a2a dispatch':>13} {'a2a combine':>12} {'ours/meas':>10}"
          f"   {'ours HybridEP us':>16} {'HybridEP disp/comb':>19} {'ours/meas':>10}")
    ratios, hybrid = [], []
    for preset, rows in TABLE_7.items():
        per_node = Cluster.preset(preset).gpus_per_node
        for ep, (h_disp, disp, h_comb, comb) in rows.items():
            cluster = Cluster.preset(preset, nodes=max(1, ep // per_node), gpus_per_node=min(ep, per_node))
            ours = collective_time("all-to-all", routed, ep, 1, cluster) * 1e6
            ratio = ours / ((disp + comb) / 2)
            ratios.append((preset, ratio))
            dedup = deduplicated_all_to_all_time(SEQ * HIDDEN * BYTES, TOP_K, EXPERTS, ep, 1, cluster) * 1e6
            h_ratio = dedup / ((h_disp + h_comb) / 2)
            hybrid.append((preset, h_ratio))
            print(f"{preset:<13} {ep:>3} {ours:>8.0f} {disp:>13} {comb:>12} {ratio:>10.2f}   {dedup:>16.0f} "
                  f"{f'{h_disp}/{h_comb}':>19} {h_ratio:>10.2f}")
    for preset in TABLE_7:
        rs = [r for p, r in ratios if p == preset]
        print(f"\n{preset}: predicted over measured all-to-all, mean {sum(rs) / len(rs):.2f} "
              f"(range {min(rs):.2f}-{max(rs):.2f}; below 1: the model is optimistic)")
        hs = [r for p, r in hybrid if p == preset]
        print(f"{preset}: predicted over measured HybridEP, mean {sum(hs) / len(hs):.2f} "
              f"(range {min(hs):.2f}-{max(hs):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
