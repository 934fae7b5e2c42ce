"""Low-level helpers every layer may use, and that use no other part of loadgen.

- ``errors``: the one error tree (every one-line, exit-2 failure is a ``LoadgenError``);
- ``limits``: sane bounds for every number read from a file or a flag, and ``InputModel``;
- ``inputs``: checks of target URLs and extra headers; ``redact``: what may be recorded of a URL or a message;
- ``jsonfile`` / ``tomlfile``: reading and writing JSON and TOML files with one-line errors;
- ``childproc``: the one way loadgen launches and stops a child process; ``pinning``: CPU sets;
- ``interrupts``: Ctrl-C and SIGTERM as one cancellation.
"""

__all__: list[str] = []  # modules are imported by name
