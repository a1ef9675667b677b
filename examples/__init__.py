"""``filepulsar.examples``: the example notebooks, shipped with the package as data files
(this folder is the package, as ``connector/`` is ``filepulsar.connector``).

``filepulsar notebook DIR`` copies them into ``DIR``; in Python,
``importlib.resources.files("filepulsar.examples") / "topic_explorer.ipynb"``.
"""
