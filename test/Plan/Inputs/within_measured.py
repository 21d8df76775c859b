"""Compares `pipec simulate` outputs with steps bench/gpu_compare.py measured.

  within_measured.py LOG SIM.txt ROW [SIM.txt ROW ...]

LOG is gpu_compare.py's output; ROW names a row of its table (the first line
containing it), whose first number after ROW is the step in ms; SIM.txt holds
`pipec simulate`'s output ("iteration X s"). Prints one line per pair and
exits 1 if a ratio is outside 15%.
"""
import re
import sys


def main():
    log = open(sys.argv[1]).read().splitlines()
    bad = 0
    pairs = sys.argv[2:]
    for sim_path, row in zip(pairs[0::2], pairs[1::2]):
        line = next((l for l in log if row in l), None)
        if line is None:
            print(f"{row}: no such row in {sys.argv[1]}")
            bad = 1
            continue
        measured = float(re.search(r"[0-9]+\.[0-9]+", line[line.index(row) + len(row):]).group(0)) / 1e3
        simulated = float(re.search(r"iteration ([0-9.]+) s", open(sim_path).read()).group(1))
        ratio = measured / simulated
        ok = abs(ratio - 1) <= 0.15
        bad |= not ok
        print(f"{row}: measured {measured:.3f} s, simulated {simulated:.3f} s, "
              f"measured / simulated {ratio:.2f}: {'within' if ok else 'NOT within'} 15%")
    return bad


if __name__ == "__main__":
    sys.exit(main())
