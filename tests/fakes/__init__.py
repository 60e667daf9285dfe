"""Local stand-ins for what cannot run here (Resend, model providers), as real HTTP servers on 127.0.0.1."""
