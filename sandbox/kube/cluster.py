"""One emulated Kubernetes cluster: the API semantics on top of the :mod:`.store`.

This is where the rules of the API server live: uid and creationTimestamp on create, ``generateName``,
optimistic concurrency on ``metadata.resourceVersion`` (409), ``generation`` bumped on spec changes,
the ``status`` and ``scale`` subresources, field validation (422 with every cause), namespace existence,
CRD registration (storing a CRD is what makes its kind servable) and server-side apply. Defaulting
(:mod:`.defaults` for built-ins, the schema's defaults for custom resources) runs on every write, before
validation and the generation comparison. Deletion, finalizers and garbage collection are in
:mod:`.deletion`.

The HTTP front is a thin translation onto these methods, and they are also the in-process API that
simulated controllers call (from any thread: the store serialises writes).
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import admission, defaults, deletion, podrules
from .apply import now_iso, record_update, server_side_apply
from .devices import DeviceGate
from .downloader import Downloads
from .errors import ApiError, FieldError, already_exists, bad_request, conflict, gone, invalid, not_found
from .logs import PodLogs
from .patch import apply_patch
from .resources import BUILTINS, CRD_KEY, NAMESPACE_KEY, ResourceType, types_from_crd
from .selectors import jsonpath_get, jsonpath_set, label_selector_from_match, object_matcher
from .store import Loc, Obj, Store
from .validation import BuiltinValidator, CustomValidator, apply_defaults, check_metadata, finish

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Workload kinds whose status the API server resets on create (their controllers own it), with the
# fields their status schema requires.
_STATUS_ON_CREATE: dict[tuple[str, str], dict[str, int]] = {
    ("apps", "deployments"): {},
    ("apps", "replicasets"): {"replicas": 0},
    ("apps", "statefulsets"): {"replicas": 0},
    ("apps", "daemonsets"): {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
                             "numberReady": 0},
    ("batch", "jobs"): {},
}


Warnings = list[str]  # (aliases: inside Cluster, ``list`` names the list verb)
Entries = list[tuple[Loc, Obj]]


def clone(obj: Any) -> Any:
    """Deep copy of a JSON value (faster than ``copy.deepcopy`` for plain JSON)."""
    return json.loads(json.dumps(obj))


@dataclass
class WriteResult:
    obj: Obj
    created: bool = False
    warnings: list[str] = field(default_factory=list)


@dataclass
class WriteOptions:
    manager: str = ""
    validation: str = "Warn"  # fieldValidation: Strict | Warn | Ignore
    dry_run: bool = False
    force: bool = False


@dataclass
class ListResult:
    items: list[Obj]
    resource_version: str
    continue_token: str = ""
    remaining: int | None = None


class Cluster:
    def __init__(self, name: str, *, history: int = 20_000, builtin_validator: BuiltinValidator | None = None,
                 custom_validator: CustomValidator | None = None, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        # What time it is in this cluster (epoch seconds): wall time, or the sandbox's simulated clock, so
        # that Kubernetes timestamps and ages agree with the AWS side's.
        self.clock = clock
        self.store = Store(history)
        self.logs = PodLogs()
        self.devices: DeviceGate | None = None  # set: nodes advertise devices only where their plugin runs
        self.downloads = Downloads()  # model-download pods' simulated `hf download` (:mod:`.downloader`)
        # (AWS endpoint URL, region) of the sandbox's AWS world, which in-cluster AWS controllers call (None: none)
        self.cloud: tuple[str, str] | None = None
        self._builtin = builtin_validator or BuiltinValidator()
        self._custom = custom_validator or CustomValidator()
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._types_lock = threading.Lock()
        self._crd_types: dict[str, list[ResourceType]] = {}
        for rt in BUILTINS:
            self._types[(rt.group, rt.version, rt.plural)] = rt
        self.on_types_changed: list[Callable[[], None]] = []
        # Bumped after every change to the served types: anything derived from resource_types() (the
        # OpenAPI documents) is current only if the generation it was built at is still this one.
        self.types_generation = 0

    def now_iso(self) -> str:
        return now_iso(self.clock())

    def bootstrap(self) -> None:
        """Create the namespaces every cluster has (skipped when state was restored)."""
        ns_rt = self.builtin("", "namespaces")
        for ns in SYSTEM_NAMESPACES:
            if self.store.get(NAMESPACE_KEY, ("", ns)) is None:
                self.create(ns_rt, None, {"metadata": {"name": ns}}, WriteOptions(manager="kube-apiserver"))

    def restored(self) -> None:
        """Re-register the CRD types after the store was loaded from a snapshot."""
        for _, crd in self.store.items(CRD_KEY):
            self._register_crd(crd)

    # --- type registry ----------------------------------------------------------------------------------

    def resource_types(self) -> list[ResourceType]:
        return list(self._types.values())

    def builtin(self, group: str, plural: str) -> ResourceType:
        return next(rt for rt in BUILTINS if rt.group == group and rt.plural == plural)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self._types.get((group, version, plural))
        if rt is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rt

    def find_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return next((rt for rt in self._types.values()
                     if rt.group == group and rt.version == version and rt.kind == kind), None)

    def _register_crd(self, crd: Obj) -> None:
        name = crd["metadata"]["name"]
        for rt in self._crd_types.pop(name, []):
            self._types.pop((rt.group, rt.version, rt.plural), None)
        types = types_from_crd(crd)
        self._crd_types[name] = types
        for rt in types:
            self._types[(rt.group, rt.version, rt.plural)] = rt
        self._types_changed()

    def unregister_crd(self, crd: Obj) -> None:
        name = crd["metadata"]["name"]
        types = self._crd_types.pop(name, [])
        for rt in types:
            self._types.pop((rt.group, rt.version, rt.plural), None)
        if types:
            self.store.drop_key(types[0].key)
        self._types_changed()

    def _types_changed(self) -> None:
        with self._types_lock:  # callers on different threads must never lose a bump
            self.types_generation += 1
        for cb in self.on_types_changed:
            cb()

    # --- reads ------------------------------------------------------------------------------------------

    def out(self, rt: ResourceType, obj: Obj) -> Obj:
        """The stored object as seen through ``rt``'s version (CRs are served in every version)."""
        if obj.get("apiVersion") != rt.api_version:
            return {**obj, "apiVersion": rt.api_version}
        return obj

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.store.get(rt.key, self._loc(rt, namespace, name))
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        return self.out(rt, obj)

    def list(self, rt: ResourceType, namespace: str | None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int = 0, continue_token: str = "") -> ListResult:
        match = object_matcher(label_selector, field_selector)
        start: Loc | None = None
        scope = namespace if rt.namespaced else None
        with self.store.lock:
            rv = self.store.rv
            entries = self.store.items(rt.key, scope)
            if continue_token:  # later pages are served at the first page's resourceVersion, a snapshot
                start, rv = _decode_continue(continue_token)
                if rv < self.store.compacted_rv:
                    raise gone("The provided continue parameter is too old to display a consistent list result. "
                               "You can start a new list without the continue parameter.")
                entries = self._entries_at(rt, entries, rv, scope)
        selected = [obj for loc, obj in entries if (start is None or loc > start) and match(obj)]
        result = ListResult([self.out(rt, o) for o in selected], str(rv))
        if limit and len(selected) > limit:
            result.items = result.items[:limit]
            last = selected[limit - 1]["metadata"]
            result.continue_token = _encode_continue((last.get("namespace", ""), last["name"]), rv)
            result.remaining = len(selected) - limit
        return result

    def _entries_at(self, rt: ResourceType, entries: Entries, rv: int, namespace: str | None) -> Entries:
        """``entries`` (current) as they were at ``rv``, undone from the watch history (under the store lock)."""
        before: dict[Loc, Obj | None] = {}
        for event in self.store.history:
            if event.rv > rv and event.key == rt.key:
                meta = event.obj["metadata"]
                before.setdefault((meta.get("namespace", ""), meta["name"]), event.old)
        snapshot: dict[Loc, Obj] = dict(entries)
        for loc, old in before.items():
            if namespace and loc[0] != namespace:
                continue
            if old is None:
                snapshot.pop(loc, None)
            else:
                snapshot[loc] = old
        return sorted(snapshot.items(), key=lambda e: e[0])

    # --- writes -----------------------------------------------------------------------------------------

    def create(self, rt: ResourceType, namespace: str | None, body: Obj,
               opts: WriteOptions | None = None) -> WriteResult:
        opts = opts or WriteOptions()
        obj = clone(body)
        if not isinstance(obj, dict):
            raise bad_request("the request body must be a JSON object")
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        self._check_namespace(rt, namespace, meta)
        with self.store.lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, namespace, meta["generateName"])
            loc = self._loc(rt, namespace, meta.get("name", ""))
            if meta.get("name") and self.store.get(rt.key, loc) is not None:
                raise already_exists(rt.plural, rt.group, meta["name"])
            if meta.get("resourceVersion"):
                raise bad_request("resourceVersion should not be set on objects to be created")
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = self.now_iso()
            meta["generation"] = 1
            meta.pop("deletionTimestamp", None)
            self._reset_status_on_create(rt, obj)
            self._default(rt, loc, obj, None)
            admission.admit_create(self, rt, obj)
            if opts.manager:
                record_update(obj, opts.manager, body, rt.status, self.now_iso())
            result = self._commit(rt, loc, obj, None, opts, created=True)
            if not opts.dry_run:
                admission.after_create(self, rt, result.obj)
            return result

    def replace(self, rt: ResourceType, namespace: str | None, name: str, body: Obj,
                opts: WriteOptions | None = None, subresource: str = "") -> WriteResult:
        opts = opts or WriteOptions()
        new = clone(body)
        if not isinstance(new, dict):
            raise bad_request("the request body must be a JSON object")
        with self.store.lock:
            loc = self._loc(rt, namespace, name)
            old = self.store.get(rt.key, loc)
            if old is None:
                raise not_found(rt.plural, rt.group, name)
            body_meta = new.get("metadata") or {}
            if body_meta.get("name") not in (None, name):
                raise bad_request(f"the name of the object ({body_meta.get('name')}) does not match the name "
                                  f"on the URL ({name})")
            rv = body_meta.get("resourceVersion")
            if not rv:
                if rt.crd is not None or rt.key == CRD_KEY:
                    raise ApiError(422, "Invalid", f'{rt.plural}.{rt.group} "{name}" is invalid: '
                                   "metadata.resourceVersion: Invalid value: 0: must be specified for an update")
            elif rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt.plural, rt.group, name, "the object has been modified; please apply your "
                               "changes to the latest version and try again")
            if opts.manager:
                record_update(new, opts.manager, body, rt.status and subresource != "status", self.now_iso())
            return self._update(rt, loc, old, new, opts, subresource)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: Any,
              opts: WriteOptions | None = None, subresource: str = "") -> WriteResult:
        opts = opts or WriteOptions()
        if patch_type == "strategic" and (rt.crd is not None):
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json-patch+json, "
                           "application/merge-patch+json, application/apply-patch+yaml")
        with self.store.lock:
            loc = self._loc(rt, namespace, name)
            old = self.store.get(rt.key, loc)
            if patch_type == "apply":
                return self._apply(rt, namespace, name, loc, old, body, opts, subresource)
            if old is None:
                raise not_found(rt.plural, rt.group, name)
            new = apply_patch(patch_type, self.out(rt, old), body)
            rv = (new.get("metadata") or {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise conflict(rt.plural, rt.group, name, "the object has been modified; please apply your "
                               "changes to the latest version and try again")
            new = clone(new)
            if opts.manager:
                record_update(new, opts.manager, body if isinstance(body, dict) else {},
                              rt.status and subresource != "status", self.now_iso())
            return self._update(rt, loc, old, new, opts, subresource)

    def _apply(self, rt: ResourceType, namespace: str | None, name: str, loc: Loc, old: Obj | None, body: Any,
               opts: WriteOptions, subresource: str) -> WriteResult:
        if not isinstance(body, dict):
            raise bad_request("apply patch must be an object")
        if not opts.manager:
            raise bad_request("PATCH, application/apply-patch+yaml requires a fieldManager")
        applied = clone(body)
        meta = applied.setdefault("metadata", {})
        if meta.get("name") not in (None, name):
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                              f"({name})")
        meta["name"] = name
        skip_status = rt.status and subresource != "status"
        describe = f"{rt.plural}.{rt.group}/{name}" if rt.group else f"{rt.plural}/{name}"
        if old is None:
            if subresource:
                raise not_found(rt.plural, rt.group, name)
            obj = server_side_apply(None, applied, opts.manager, opts.force, skip_status, describe,
                                    self.now_iso())
            result = self.create(rt, namespace, {k: v for k, v in obj.items()}, WriteOptions(
                manager="", validation=opts.validation, dry_run=opts.dry_run))
            return result
        new = server_side_apply(self.out(rt, old), applied, opts.manager, opts.force, skip_status, describe,
                                    self.now_iso())
        return self._update(rt, loc, old, new, opts, subresource)

    def _update(self, rt: ResourceType, loc: Loc, old: Obj, new: Obj, opts: WriteOptions,
                subresource: str) -> WriteResult:
        meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        if subresource == "status":
            # Only .status changes through /status; everything else comes from the stored object.
            status = new.get("status")
            new = clone(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            if "managedFields" in meta:
                new["metadata"]["managedFields"] = meta["managedFields"]
            meta = new["metadata"]
        else:  # a /status write keeps the stored (already defaulted) spec
            self._default(rt, loc, new, old)
            if rt.status:
                if "status" in old:
                    new["status"] = clone(old["status"])
                else:
                    new.pop("status", None)
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        if rt.namespaced:
            meta["namespace"] = loc[0]
        meta["name"] = loc[1]
        meta["generation"] = old_meta.get("generation", 1)
        if _spec_of(new, rt) != _spec_of(old, rt):
            meta["generation"] += 1
        if old_meta.get("deletionTimestamp") and old_meta.get("finalizers") and not meta.get("finalizers") \
                and rt.key != NAMESPACE_KEY:  # the update removed the last finalizer: the object goes now
            if opts.dry_run:
                return WriteResult(self.out(rt, new))
            deletion.finalize(self, rt, loc)
            return WriteResult(self.out(rt, new))
        result = self._commit(rt, loc, new, old, opts, created=False)
        if rt.key == NAMESPACE_KEY and old_meta.get("deletionTimestamp") and not opts.dry_run:
            deletion.try_finish_namespace(self, loc[1])  # goes only once empty and without finalizers
        return result

    def _commit(self, rt: ResourceType, loc: Loc, obj: Obj, old: Obj | None, opts: WriteOptions,
                created: bool) -> WriteResult:
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        meta = obj["metadata"]
        if rt.namespaced:
            meta["namespace"] = loc[0]
        else:
            meta.pop("namespace", None)
        if old is not None:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        else:
            meta.pop("resourceVersion", None)
        if rt.key == ("", "nodes") and self.devices is not None:
            self.devices.filter(obj)
        warnings = self._validate(rt, obj, opts.validation, old)
        if rt.key == CRD_KEY:
            _prepare_crd(obj, self.now_iso())
        if rt.key == NAMESPACE_KEY and created:
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj["status"] = {"phase": "Active"}
        if old is not None and _without_times(obj) == _without_times(old):
            return WriteResult(self.out(rt, old), False, warnings)  # no change: no new resourceVersion, no event
        if opts.dry_run:
            return WriteResult(self.out(rt, obj), created, warnings)
        stored = self.store.put(rt.key, loc, obj, "ADDED" if created else "MODIFIED")
        if rt.key == CRD_KEY:
            self._register_crd(stored)
        return WriteResult(self.out(rt, stored), created, warnings)

    def _validate(self, rt: ResourceType, obj: Obj, mode: str, old: Obj | None = None) -> Warnings:
        errors = check_metadata(obj, rt)
        if rt.crd is not None:
            crd = self.store.get(CRD_KEY, ("", rt.crd))
            crd_rv = int(crd["metadata"]["resourceVersion"]) if crd else 0
            outcome = self._custom.validate(rt, obj, crd_rv)
            errors.extend(self._custom.cel.errors(rt.schema, obj, old))
        else:
            outcome = self._builtin.validate(rt, obj)
        warnings = finish(outcome, obj, mode)
        errors.extend(outcome.errors)
        errors.extend(defaults.template_errors(rt, obj))
        errors.extend(podrules.errors(rt, obj))
        if rt.key == CRD_KEY:
            errors.extend(_crd_errors(obj))
        if errors:
            raise invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), errors)
        return warnings

    def _default(self, rt: ResourceType, loc: Loc, obj: Obj, old: Obj | None) -> None:
        """Fill in the API defaults of a write (under the store lock: a Service's cluster IP is allocated
        against the stored Services)."""
        if rt.crd is not None:
            if rt.schema is not None:
                apply_defaults(rt.schema, obj)
            return
        defaults.apply_defaults(rt, obj, old, lambda: (svc for at, svc in self.store.items(rt.key) if at != loc))

    def _reset_status_on_create(self, rt: ResourceType, obj: Obj) -> None:
        if rt.crd is not None and rt.status:
            obj.pop("status", None)
        elif rt.key in _STATUS_ON_CREATE:
            obj["status"] = dict(_STATUS_ON_CREATE[rt.key])
        elif rt.key == ("", "pods"):
            obj["status"] = {"phase": "Pending", **{k: v for k, v in (obj.get("status") or {}).items()
                                                     if k == "qosClass"}}

    def _check_namespace(self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> None:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return
        if meta.get("namespace") and namespace and meta["namespace"] != namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        ns = namespace or meta.get("namespace") or "default"
        ns_obj = self.store.get(NAMESPACE_KEY, ("", ns))
        if ns_obj is None:
            raise not_found("namespaces", "", ns)
        if ns_obj["metadata"].get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f'{rt.plural} "{meta.get("name", "")}" is forbidden: unable to '
                           f"create new content in namespace {ns} because it is being terminated")
        meta["namespace"] = ns

    def _generate_name(self, rt: ResourceType, namespace: str | None, prefix: str) -> str:
        for _ in range(8):
            name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
            if self.store.get(rt.key, self._loc(rt, namespace, name)) is None:
                return name
        raise ApiError(409, "AlreadyExists", f"could not generate a unique name for prefix {prefix}")

    def _loc(self, rt: ResourceType, namespace: str | None, name: str) -> Loc:
        return ((namespace or "default") if rt.namespaced else "", name)

    # --- scale ------------------------------------------------------------------------------------------

    def get_scale(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        if rt.scale is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        obj = self.get(rt, namespace, name)
        spec = jsonpath_get(obj, rt.scale.spec_replicas)
        status = jsonpath_get(obj, rt.scale.status_replicas)
        selector = ""
        if rt.scale.label_selector:
            found = jsonpath_get(obj, rt.scale.label_selector)
            selector = found[0] if found and isinstance(found[0], str) else ""
            if not selector and rt.crd is None:
                selector = label_selector_from_match((obj.get("spec") or {}).get("selector"))
        meta = obj["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": spec[0] if spec else 0},
            "status": {"replicas": status[0] if status else 0, "selector": selector},
        }

    def update_scale(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: Any,
                     opts: WriteOptions | None = None) -> Obj:
        with self.store.lock:
            scale = self.get_scale(rt, namespace, name)
            assert rt.scale is not None
            new_scale = body if patch_type == "replace" else apply_patch(
                "merge" if patch_type in ("strategic", "apply") else patch_type, scale, body)
            rv = (new_scale.get("metadata") or {}).get("resourceVersion")
            if rv and rv != scale["metadata"]["resourceVersion"]:
                raise conflict(rt.plural, rt.group, name, "the object has been modified; please apply your "
                               "changes to the latest version and try again")
            replicas = (new_scale.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise invalid("Scale", "autoscaling", name, [FieldError(
                    "spec.replicas", f"Invalid value: {json.dumps(replicas)}: must be greater than or equal to 0")])
            loc = self._loc(rt, namespace, name)
            old = self.store.get(rt.key, loc)
            if old is None:
                raise not_found(rt.plural, rt.group, name)
            obj = clone(self.out(rt, old))
            jsonpath_set(obj, rt.scale.spec_replicas, replicas)
            opts = opts or WriteOptions()
            if opts.manager:
                record_update(obj, opts.manager, {"spec": {"replicas": replicas}}, False, self.now_iso())
            self._update(rt, loc, old, obj, opts, "")
            return self.get_scale(rt, namespace, name)


def _without_times(obj: Obj) -> Obj:
    """``obj`` without the managedFields timestamps, which every write renews."""
    fields = obj["metadata"].get("managedFields")
    if not fields:
        return obj
    return {**obj, "metadata": {**obj["metadata"], "managedFields": [
        {k: v for k, v in entry.items() if k != "time"} for entry in fields]}}


def _spec_of(obj: Obj, rt: ResourceType) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _prepare_crd(crd: Obj, now: str) -> None:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    crd["status"] = {
        "acceptedNames": names,
        "storedVersions": [v["name"] for v in spec.get("versions", []) if v.get("storage")],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    }


def _crd_errors(crd: Obj) -> list[FieldError]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    errors = []
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if crd["metadata"].get("name") != expected:
        errors.append(FieldError("metadata.name", f'Invalid value: "{crd["metadata"].get("name")}": must be '
                                 f"spec.names.plural+\".\"+spec.group"))
    if sum(1 for v in spec.get("versions", []) if v.get("storage")) != 1:
        errors.append(FieldError("spec.versions", "Invalid value: must have exactly one version marked as "
                                 "storage version"))
    return errors


def _encode_continue(loc: Loc, rv: int) -> str:
    raw = json.dumps({"rv": rv, "start": list(loc)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[Loc, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        return (str(data["start"][0]), str(data["start"][1])), int(data["rv"])
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from exc
