"""The deployment file of `headrace deploy apply`, read without HTTP: YAML with `name` plus the spec
PUT /deployments/{name} takes, or `pipeline: file.py` in place of `jarId`. Every problem is a
DeploymentFileError naming the file and what to fix (the command prints it and exits 2); the
spec's own fields are the server's to check, which refuses unknown ones with a message naming them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from shared.artifact_kind import kind_of
from shared.deployment_spec import NAME_EXPECTED, NAME_PATTERN
from shared.errors import ConfigError

NAME_RULE = re.compile(NAME_PATTERN)  # the dispatcher's rule (shared/deployments.py), checked before a request
NAME_RULE_TEXT = NAME_EXPECTED


class DeploymentFileError(ConfigError, ValueError):
    """A deployment file that cannot be applied; the message names the file and what to fix."""


@dataclass(frozen=True)
class DeploymentFile:
    name: str
    body: dict  # PUT /deployments/{name}'s body; without jarId while `pipeline` is still to upload
    pipeline: Path | None


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader, strict where YAML's defaults would change a spec silently: a repeated key is
    an error (PyYAML keeps the last one), and a date stays the text it was (JSON has no dates, and
    `programArgsList: [--day, 2024-01-01]` means the text)."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rule) for tag, rule in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _mapping_without_repeats(loader: _SpecLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden: not a repeat
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
        except TypeError:  # an unhashable key: construct_mapping says so below, with its line
            continue
        if repeated:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is None:  # a reader error (a control character, bad encoding): one line still
        return " ".join(str(exc).split())
    context = getattr(exc, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {getattr(exc, 'problem', None) or exc}" + (
        f" ({context})" if context else ""
    )


def parse_deployment(text: str, source: str, base_dir: Path) -> DeploymentFile:
    """The deployment of a file's text; `pipeline` is taken relative to `base_dir` (the file's
    directory), so a deployment file and its pipeline can move together."""
    try:
        doc = yaml.load(text, Loader=_SpecLoader)  # safe: a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise DeploymentFileError(f"{source}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(doc, dict):
        got = "nothing" if doc is None else f"a {type(doc).__name__}"
        raise DeploymentFileError(
            f"{source}: the top level must be a mapping (name: ..., jarId or pipeline: ..., "
            f"parallelism: ...), found {got}"
        )
    body = dict(doc)
    name = body.pop("name", None)
    if name is None:
        raise DeploymentFileError(f"{source}: no `name` (the deployment's name: {NAME_RULE_TEXT})")
    if not isinstance(name, str):
        raise DeploymentFileError(
            f"{source}: `name` must be text, YAML read {name!r} as {type(name).__name__}; quote it"
        )
    if not NAME_RULE.match(name):
        raise DeploymentFileError(f"{source}: name {name!r} is not valid: {NAME_RULE_TEXT}")
    pipeline = body.pop("pipeline", None)
    if (pipeline is None) == ("jarId" not in body):
        raise DeploymentFileError(
            f"{source}: give exactly one of `jarId` (an uploaded jar's id) and "
            f"`pipeline` (a .py or .zip file to upload)"
        )
    if pipeline is not None and (not isinstance(pipeline, str) or not pipeline.strip()):
        raise DeploymentFileError(f"{source}: `pipeline` must be a file path, got {pipeline!r}")
    args = body.get("programArgsList")
    for i, arg in enumerate(args if isinstance(args, list) else []):
        # The server would refuse `10` or `yes` too, but only the reader of the YAML can say why.
        if not isinstance(arg, str):
            raise DeploymentFileError(
                f"{source}: programArgsList[{i}]: YAML read {arg!r} as "
                f"{type(arg).__name__}, arguments are text; quote it"
            )
    try:
        json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DeploymentFileError(f"{source}: a value has no JSON form ({exc})") from None
    path = None if pipeline is None else base_dir / Path(pipeline).expanduser()
    return DeploymentFile(name, body, path)


def load_deployment_file(file: Path) -> DeploymentFile:
    """Read and check a deployment file and that its pipeline (if any) is there to upload."""
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DeploymentFileError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DeploymentFileError(f"{file}: cannot read it: {exc}") from None
    parsed = parse_deployment(text, str(file), file.parent)
    if parsed.pipeline is not None:
        if not parsed.pipeline.is_file():
            raise DeploymentFileError(
                f"{file}: pipeline {parsed.pipeline}: no such file (a relative path is "
                f"taken from the deployment file's directory)"
            )
        if kind_of(parsed.pipeline) is None:
            raise DeploymentFileError(
                f"{file}: pipeline {parsed.pipeline}: a pipeline is a .py file or a .zip of a package"
            )
    return parsed
