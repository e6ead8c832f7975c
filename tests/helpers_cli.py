"""Validating ``purax`` command lines written in the README, the guides and
docstrings (tests/test_readme_commands.py, tests/test_docs.py)."""

from purax.app import cli


def validate_commands(commands: list[list[str]], where: str) -> set[str]:
  """Each ``purax ...`` argv is accepted by the parser, and a train or sweep
  config passes validation (flags, bounds, specs, cadences); returns the
  subcommands seen."""
  from purax.app.config import TrainConfig
  from purax.app.sweep import SweepConfig
  seen = set()
  for argv in commands:
    if '--help' in argv:
      continue
    argv = [a for a in argv if a != '--dry-run'] + (['--dry-run'] if '--dry-run' in argv else [])
    command = cli.parse(argv)
    seen.add(argv[0])
    if isinstance(command, (TrainConfig, SweepConfig)):
      try:
        command.validate()
      except Exception as e:    # the data file of an example (data.npz) is not here
        raise AssertionError(f'{where}: purax {" ".join(argv)}: {e}') from e
  return seen
