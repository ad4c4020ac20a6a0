"""sowstream's compiled fold: see ``sowstream.engine.native`` for how the engine uses it."""

from sowstream_native._fold import Chunk, raw_records

__all__ = ["Chunk", "raw_records"]
