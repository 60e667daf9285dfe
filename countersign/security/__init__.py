"""Links, the journal codec, request identity, redaction and text safety."""
