"""The workloads of ``bench_all.py``, a module each; each one's ``run(ctx)`` measures
into ``ctx.results``, and ``report.py`` prints them."""
