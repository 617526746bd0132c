"""Print chosen metrics of an Nsight Compute report's details page (``ncu -i R --page details --csv``), one line per
(launch, metric): kernel names hold commas, so the CSV is parsed, not cut.

Usage: python benchmarks/ncu_details.py details.csv [--metrics "Duration,DRAM Throughput,..."]
"""
import argparse
import csv

DEFAULT = ("Duration,Elapsed Cycles,SM Active Cycles,DRAM Throughput,Memory Throughput,L1/TEX Hit Rate,L2 Hit Rate,"
           "L2 Compression Input Sectors")


def short(name: str) -> str:
    """Kernel name -> a short label (the CUDA row-group AR / row-group / sb kernels, Triton's chain kernel, else the
    name's first 40 characters)."""
    for key, label in (("chain_verify_rg_ar_kernel", "cuda_ar"), ("chain_verify_rg_kernel", "cuda_rg"),
                       ("chain_verify_sb_kernel", "cuda_sb"), ("_chain_verify_kernel", "triton")):
        if key in name:
            return label
    return name[:40]


def read_metrics(path: str, want: set[str]) -> list[tuple[str, str, str, str, str]]:
    """(launch ID, kernel label, metric, value, unit) of each wanted metric, first occurrence per (launch, metric,
    unit), in file order. Lines before the table (ncu's notes) are skipped. Raises ValueError when the file has no
    details table (no "Metric Name" column)."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    reader = csv.DictReader(lines)
    if reader.fieldnames is None or "Metric Name" not in reader.fieldnames:
        raise ValueError(f"{path}: not an ncu details-page CSV (no 'Metric Name' column)")
    out, seen = [], set()
    for r in reader:
        key = (r["ID"], r["Metric Name"], r["Metric Unit"])
        if r["Metric Name"] in want and key not in seen:
            seen.add(key)
            out.append((r["ID"], short(r["Kernel Name"]), r["Metric Name"], r["Metric Value"], r["Metric Unit"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--metrics", default=DEFAULT, help="comma-separated metric names")
    a = ap.parse_args()
    for i, k, name, value, unit in read_metrics(a.csv, set(a.metrics.split(","))):
        print(f"{i:>3} {k:8} {name:30} {value:>10} {unit}")


if __name__ == "__main__":
    main()
