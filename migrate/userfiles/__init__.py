"""The user's files: which a run converts (and whether each is Python text), notebooks, atomic writes, -o copies."""
