"""PyTorch Monarch's ``monarch.tools``: its argparse command line (``python -m monarch.tools.cli``:
apply, exec, shell, kill, context, query, profile, ...), what each command does
(``monarch.tools.commands``, also TorchX's create/info/kill of a server), and the helpers a launcher
script uses (``network``, ``utils``, ``config``, ``mesh_spec``), on monarch's own machinery.  Our
``monarch`` console command (``monarch_cli``) is a separate, richer CLI with the same verbs."""
