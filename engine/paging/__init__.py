"""The expert pager and what it is made of (docs/engine-contract.md, "Paging"):

    pager.py         the ExpertStore of a paged run; ties the parts below together
    config.py        PagerConfig from the CLI and the SDQ_* environment; profile files
    budget.py        the --ram-budget-mb estimate
    arena.py         slots: one aligned allocation, two size classes, file layouts
    cache_policy.py  which expert is in which slot (pure logic, exact counters)
    expert_io.py     reader threads that move bytes from the file into slots
    prefetch.py      layer-ahead prediction and its logical queue

A `--no-pager` run imports none of it except config (PagerConfig is an Options field).
"""
