"""The side objects beside the approvals: inbox, audit trail, trust figures (kept in the approvals'
bookkeeping shards, one call per run and phase), email delivery."""
