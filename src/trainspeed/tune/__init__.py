"""`trainspeed tune`: measure each speed switch on the user's own config, keep the fastest.

    knobs.py       which settings each knob tries, and why it skips others (plain functions)
    trials.py      one short training run per setting, each in a fresh subprocess
    stats.py       seconds per sample, bootstrap speedup intervals, verdicts (pure)
    search.py      ablation -> greedy combination -> verification, within a budget
    store.py       finished trials on disk, so an interrupted tune resumes
    batch_size.py  the batch-size candidates (largest that fits, fastest per sample)
    table.py       the tables in the terminal, as HTML and as Markdown
    session.py     the whole `trainspeed tune` run: trial config, outputs, best.yaml

Nothing here is imported by the engine; only this package changes a config.
"""
