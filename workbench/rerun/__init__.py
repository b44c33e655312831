"""Run again: what changes the model's computation. ``prune`` (pruned prefill, SPEC §7), ``stability``
(§7 diagnostics), ``eviction`` (KV eviction policies, §9)."""
