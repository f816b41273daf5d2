"""Retention: which SSM states earn a page, and how long kept entries stay.

The one owner of hycache's retention decisions beside the pools (docs/admission.md); the
managers only do their own verbs (state IO; lookup, allocate, commit, free) and ask it:

    policy   the interface the cache manager asks (`Retention`), `AdmissionPolicy` and
             `KeepEverything` (no admission: `--no-admission`, or a second tier attached)
    rule     the admission rule (`Admission`), its tuned constants, the demotion bar
    ledger   the decode snapshot decisions, the pages to come, held snapshots given back
    ghosts   the keys a pool evicted last, and what an admission would have gained from them
    hints    the bound on client prefix-hint states per request and per cache salt
    aging    where a released request's states go in the eviction order (refresh, demote)
    protection  what a request's release protects (`protect_declared`, `protect_reused`)

The pools keep the mechanisms the policy drives (`BlockPool`: the queues, `demote`,
`refresh`, the per-kind `ReuseStats`).
"""
