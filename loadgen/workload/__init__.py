"""What is sent: the scenario (request classes, distributions, budgets, traces), prompts built to exact
token counts, the shipped presets, and how requests are routed to replicas.

- ``scenario``: the scenario file's schema and validation;
- ``distributions``: token-length distributions;
- ``prompts``: deterministic prompt text of an exact token count, and tokenizers;
- ``words``: the common English words (the prompt vocabulary, and the language identifier's English list);
- ``presets``: the shipped scenarios, engine configs, plans and traces;
- ``routing``: which replica a request goes to (shared by the driver and the simulated fleet).
"""

__all__: list[str] = []  # modules are imported by name
