"""The commands, the top floor: `cli` (the `dra-quota` entry point), `serve` (wires the webhook,
the controllers and the caches into one process), `demo` (a local cluster). May import every floor."""
