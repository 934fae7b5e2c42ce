"""The run directory: the contract every part of loadgen shares (driver, simulator, importers, analysis).

One module per job:

- ``schema``: file names, the Arrow schemas of ``requests``, ``chunks`` and the other tables, statuses and
  the HTTP status → error kind table;
- ``manifest``: the typed manifest (``manifest.json``: identity of everything that ran);
- ``identity``: the harness, host and package versions that go into the manifest;
- ``parts``: a table as a directory of closed part files (readable after SIGKILL);
- ``part_process``: the child process that converts and writes parts at low CPU priority;
- ``rowtables``: column buffers that become Arrow tables;
- ``io``: ``RunWriter`` and the readers of a run directory;
- ``foreign``: other tools' per-request results (LLMPerf, vLLM's bench) as run directories.

Modules are imported by name (``from loadgen.rundir.io import RunWriter``); this file imports none of them,
so a reader of the schema does not load the writer.
"""

__all__: list[str] = []  # modules are imported by name
