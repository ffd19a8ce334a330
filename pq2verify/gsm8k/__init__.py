"""GSM8K answer-diff harness: does a kernel change change the model's answers, and why.

`pq2verify gsm8k --a legacy --b tuned` runs the same greedy generations under two kernel
configurations and reports every answer that differs, with the first differing token and the
log-probability margin there (near-tie flip or real divergence). See cli.py for the options.
"""
