"""Names a hostile hub (or a hostile ref) may send. Every one must be refused."""

HOSTILE_NAMES = [
    "../x", "../../etc/passwd", "/abs", "/etc/passwd", "/", "C:\\x", "C:x", "c:/x", "\\\\host\\share\\x",
    "\\\\?\\C:\\x", "//host/share", "\\", "a\\b", "dir\\..\\x", "a\x00b", "a/../../b", "a/..", "..", ".", "./x",
    "x/./y", "", "a//b", "a/", "x:stream", "con", "CON.gguf", "nul.txt", "aux", "com1.gguf", "lpt9", "x.", "x ",
    "~/x", "~root", "a\nb", "a\rb", "a\tb", "\u202egguf.exe", "a\u200bb", "\uff0e\uff0e/x", "a\uff0fb", "\ud800x",
    "a/" * 40 + "x", "x" * 300, "x/../../../tmp/evil", "models/../../x", "..\\..\\x", "snapshots/../../../x",
]
