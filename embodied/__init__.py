"""embodied: offline-to-online robot learning."""
import os

# With OpenMP's default spin-waiting, a 2-thread torch op stalls ~70x whenever another process holds a
# core (measured here). Passive waiting costs nothing on an idle machine; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
