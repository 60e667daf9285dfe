"""`AgentRun`: the batteries-included agent built on the gate's public calls."""
