"""embodied: offline-to-online robot learning."""
import os

# With OpenMP's default spin-waiting, a 2-thread torch op stalls (up to ~70x in an early session, 2x on the
# AMD EPYC) whenever another process holds a core, so the library sleeps its idle threads by default. That
# is not free on an idle machine: 2,000 CQL steps of the main job took 72 s passive against 46 s spinning on
# the AMD EPYC (benchmarks/RESULTS.md, "The main job"), so `bash run.sh train` spins. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
