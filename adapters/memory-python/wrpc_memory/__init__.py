"""The memory adapter in Python: every capability of `wrpc:broker` on the host's in-process
`wrpc:memory/store`, the same mapping as the Rust adapter in `adapters/memory/`.

Modules: `config` (options, names, errors), `wake` (wake-ups between export calls), `logs`,
`queues` (the consumer machinery), `relay` (pumps, backplane and direct). `app.py` beside this
package exports the classes componentize-py binds to the world's interfaces.
"""
