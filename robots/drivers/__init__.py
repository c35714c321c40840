"""Real-arm drivers; each imports its SDK (an optional extra) only when used."""
