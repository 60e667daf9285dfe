"""The side objects beside the approvals: inbox, audit trail, trust figures, email delivery."""
