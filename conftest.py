# Root conftest: makes `import loadgen` work from a plain checkout and registers shared options.
