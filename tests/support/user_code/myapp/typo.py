"""A module of the user's app whose Pydantic AI toolset misspells a Countersign tool, so importing it
raises: tests/integration/test_user_services.py checks that `COUNTERSIGN_SERVICES=myapp.typo:toolset`
stops `serve` at start with one line naming the tool."""

from countersign.integrations.pydantic_ai import CountersignToolset

toolset = CountersignToolset(["issue_refnd"])  # a Pydantic AI agent's tools, misspelt
