"""Print chosen metrics of an Nsight Compute report's details page (``ncu -i R --page details --csv``), one line per
(launch, metric): kernel names hold commas, so the CSV is parsed, not cut.

Usage: python benchmarks/ncu_details.py details.csv [--metrics "Duration,DRAM Throughput,..."]
"""
import argparse
import csv

DEFAULT = ("Duration,Elapsed Cycles,SM Active Cycles,DRAM Throughput,Memory Throughput,L1/TEX Hit Rate,L2 Hit Rate,"
           "L2 Compression Input Sectors")


def short(name: str) -> str:
    """Kernel name -> a short label (the CUDA row-group / sb kernels, Triton's chain kernel, else the name's start)."""
    for key, label in (("chain_verify_rg_kernel", "cuda_rg"), ("chain_verify_sb_kernel", "cuda_sb"),
                       ("_chain_verify_kernel", "triton")):
        if key in name:
            return label
    return name[:40]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--metrics", default=DEFAULT, help="comma-separated metric names")
    a = ap.parse_args()
    want = set(a.metrics.split(","))
    seen = set()
    with open(a.csv, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu may print notes before the table
    for r in csv.DictReader(lines):
        key = (r["ID"], r["Metric Name"], r["Metric Unit"])
        if r["Metric Name"] in want and key not in seen:
            seen.add(key)
            print(f'{r["ID"]:>3} {short(r["Kernel Name"]):8} {r["Metric Name"]:30} {r["Metric Value"]:>10} '
                  f'{r["Metric Unit"]}')


if __name__ == "__main__":
    main()
