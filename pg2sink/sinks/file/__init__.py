"""The file sink (--sink=file, the embedded default): JSON lines, one record per line.

config.py       FileConfig: --file-path
sink.py         FileSink: buffered appends, background fsyncs, acknowledgements
append.py       whole lines under the file's lock; a line torn by a crash is cut
imports.py      the import writer: executors append an import's rows themselves
arrow_lines.py  an import batch's JSON lines built column-wise by Arrow kernels
column_bytes.py the text and whole-second date/time columns of those lines, on their bytes
"""

from __future__ import annotations

from pg2sink.sinks.file.append import append_lines, repair_torn_line
from pg2sink.sinks.file.config import FileConfig
from pg2sink.sinks.file.sink import FileSink

__all__ = ["FileConfig", "FileSink", "append_lines", "repair_torn_line"]
