"""A made-up billing business: its own tools, its own Restate workflow calling the gate."""
