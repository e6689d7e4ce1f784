import os

# The Agents SDK exports traces to OpenAI by default; the tests run with no network and no key.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
