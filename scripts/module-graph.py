#!/usr/bin/env python3
"""The import graph of a crate's modules, and its cycles.

Usage: scripts/module-graph.py [--check] <crate>/src

Each file under src/ is a module (`foo.rs` and `foo/` are `foo`); test
modules are left out. A module depends on another when it names it in a
`use` or a `crate::`/`super::` path. A module naming its own descendants
(`mod x; pub use x::Y;`) is structure, not a dependency, and is not an
edge; a child using its parent's items is. Printed: the cycles between
modules, then the cycles between top-level modules (each collapsed to its
first path segment). With --check, any cycle fails (exit 1): the modules
then form layers, and no import points from a lower layer up.
"""
import os
import re
import sys


def modules(root):
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith('.rs'):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, root)[:-3].split('/')
            if parts[-1] in ('lib', 'main', 'mod'):
                parts = parts[:-1]
            if 'tests' in parts or (parts and parts[-1].startswith('test')):
                continue
            found[tuple(parts)] = path
    return found


def use_paths(body):
    """Every path a `use` body names, with braces expanded."""
    body = re.sub(r'\s+', '', body)
    out = []

    def expand(prefix, tree):
        items, depth, current = [], 0, ''
        for ch in tree:
            depth += ch == '{'
            depth -= ch == '}'
            if ch == ',' and depth == 0:
                items.append(current)
                current = ''
            else:
                current += ch
        if current:
            items.append(current)
        for item in items:
            nested = re.match(r'^([\w:]*?)(?:::)?\{(.*)\}$', item)
            if nested:
                expand(prefix + [p for p in nested.group(1).split('::') if p], nested.group(2))
            else:
                item = re.sub(r'as\w+$', '', item)
                out.append(prefix + [p for p in item.split('::') if p])

    expand([], body)
    return out


def graph(root):
    mods = modules(root)

    def owner(path):
        path = tuple(path)
        while path and path not in mods:
            path = path[:-1]
        return path

    edges = {}
    for module, file in mods.items():
        with open(file) as f:
            source = f.read()
        source = re.sub(r'//.*', '', source)
        source = re.sub(r'#\[cfg\(test\)\]\s*mod \w+ \{.*', '', source, flags=re.S)
        named = []
        for body in re.findall(r'\buse\s+([^;]+);', source):
            for path in use_paths(body):
                if not path:
                    continue
                head = path[0]
                if head == 'crate':
                    named.append(path[1:])
                elif head == 'super':
                    base, rest = list(module[:-1]), path[1:]
                    while rest and rest[0] == 'super':
                        base, rest = base[:-1], rest[1:]
                    named.append(base + rest)
                elif head == 'self':
                    named.append(list(module) + path[1:])
                elif module + (head,) in mods:
                    named.append(list(module) + path)
        for path in re.findall(r'\bcrate::((?:\w+::)+)\w+', source):
            named.append([p for p in path.split('::') if p])
        targets = set()
        for path in named:
            target = owner([p for p in path if p != 'self'])
            if target != module and target[:len(module)] != module:
                targets.add(target)
        edges[module] = targets
    return edges


def cycles(edges):
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in list(edges):
        if v not in index:
            visit(v)
    return groups


def report(title, edges):
    name = lambda m: '::'.join(m) or 'crate'
    groups = cycles(edges)
    print(f'{title}: {len(groups)} cycle(s)')
    for group in groups:
        members = set(group)
        for module in sorted(group):
            inside = sorted(name(t) for t in edges.get(module, ()) if t in members)
            print(f'  {name(module)} -> {", ".join(inside)}')
    return len(groups)


def main():
    args = [a for a in sys.argv[1:] if a != '--check']
    if len(args) != 1:
        sys.exit(__doc__)
    edges = graph(args[0])
    top = {}
    for module, targets in edges.items():
        for target in targets:
            if module and target and module[0] != target[0]:
                top.setdefault(module[:1], set()).add(target[:1])
    found = report('modules', edges) + report('top-level modules', top)
    if '--check' in sys.argv and found:
        sys.exit(1)


if __name__ == '__main__':
    main()
