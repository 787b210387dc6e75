"""`trainspeed tune`: measure each speed switch on the user's own config, keep the fastest.

    knobs.py       which settings each knob tries, and why it skips others (plain functions)
    options.py     TuneOptions: knobs, budget, rounds, thresholds (validated)
    trials.py      one short training run per setting, each in a fresh subprocess
    forkserver.py  the process trials are forked from (torch imported once)
    stats.py       seconds per sample, bootstrap speedup intervals, verdicts (pure)
    search.py      ablation -> greedy combination -> verification, within a budget
    order.py       the ablation's trial order (baseline brackets, odd rounds reversed)
    result.py      Row and TuneResult, what the tables and tune.json are written from
    store.py       finished trials on disk, so an interrupted tune resumes
    batch_size.py  the batch-size candidates (largest that fits, fastest per sample)
    table.py       the tables in the terminal, as HTML and as Markdown
    session.py     the whole `trainspeed tune` run: trial config, outputs, best.yaml

Nothing here is imported by the engine; only this package changes a config.
"""
