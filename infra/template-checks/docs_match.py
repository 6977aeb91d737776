#!/usr/bin/env python3
"""The README and its docs/ pages say what the template is: every alarm of template.yaml has its row in "When an
alarm fires" (and no row names an alarm the template lacks), the counts of alarms and functions
the README states are the template's, every stack output the README exports exists, the
conformance check's number of checks is the one its help and the README say, docs/design.md
counts the template's Lambdas, the template claims no IAM-only routes when one is open, and the
`sqs-once` example in README.md is the one that
compiles as sqs-once's doc test (sqs-once/README.md).

Usage: docs_match.py [ROOT]; docs_match.py --self-test
"""
import os
import re
import sys

WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def resources_of(template_text, kind):
    """Logical ids of the template's resources of one type (read as text: the template's
    short-form tags need no YAML loader)."""
    ids, current = [], None
    for line in template_text.split("\n"):
        m = re.match(r"^  ([A-Za-z0-9]+):\s*$", line)
        if m:
            current = m.group(1)
        elif current and re.match(rf"^    Type: {re.escape(kind)}\s*$", line):
            ids.append(current)
    return ids


def runbook_alarms(readme):
    """The alarms named in the first column of the "When an alarm fires" table."""
    found = re.search(r"^#{2,3} When an alarm fires$", readme, flags=re.M)
    if not found:
        raise ValueError('no "When an alarm fires" section')
    table = re.split(r"\n#{2,3} ", readme[found.end():], maxsplit=1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([A-Za-z0-9]+)`", table, flags=re.M)]


TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50}


def number_word(word):
    """'nine' -> 9, 'twenty-nine' -> 29, 'thirty' -> 30; None for other words."""
    tens, _, units = word.lower().partition("-")
    if tens in TENS and (not units or (units in WORDS and 0 < WORDS[units] < 10)):
        return TENS[tens] + (WORDS[units] if units else 0)
    return WORDS.get(word.lower()) if not units else None


def stated_count(readme, noun):
    """Every '<number word> <noun>' the README states (e.g. 'nine alarms', 'twenty-nine alarms')."""
    found = (number_word(m.group(1)) for m in re.finditer(rf"(?<![A-Za-z-])([A-Za-z]+(?:-[A-Za-z]+)?) {noun}\b", readme))
    return [n for n in found if n is not None]


def outputs_of(template_text):
    """The template's output names."""
    if "\nOutputs:\n" not in template_text:
        return []
    part = template_text.split("\nOutputs:\n", 1)[1]
    return re.findall(r"^  ([A-Za-z0-9]+):\s*$", part, flags=re.M)


def example(text):
    m = re.search(r"```rust,no_run\n(.*?)```", text, flags=re.S)
    return m.group(1) if m else None


def conformance_counts(tool_src, help_src, readme):
    """The conformance check's number of checks as the tool runs them, its help and the README
    say them."""
    tool = len(re.findall(r"results\.push\(with_table\(", tool_src))
    said = [int(n) for n in re.findall(r"in (\d+) checks", help_src)]
    said += [int(n) for n in re.findall(r"\((\d+) checks\)", readme)]
    return [f"the conformance check runs {tool} checks; its help or the README says {n}" for n in said if n != tool] + (
        [] if said else ["neither the help nor the README says how many checks the conformance check runs"])


def check(template, readme, crate_readme, design=""):
    problems = []
    alarms = resources_of(template, "AWS::CloudWatch::Alarm")
    rows = runbook_alarms(readme)
    for a in alarms:
        if a not in rows:
            problems.append(f"{a} is in the template but has no row in the README's 'When an alarm fires'")
    for r in rows:
        if r not in alarms:
            problems.append(f"the README's 'When an alarm fires' has a row for {r}, which the template lacks")
    functions = resources_of(template, "AWS::Serverless::Function")
    for noun, n in (("alarms", len(alarms)), ("functions", len(functions))):
        for said in stated_count(readme, noun):
            if said != n:
                problems.append(f"the README speaks of {said} {noun}; the template has {n}")
    for said in stated_count(design, "Lambdas"):
        if said != len(functions):
            problems.append(f"docs/design.md speaks of the {said} Lambdas; the template has {len(functions)}")
    if re.search(r"AuthorizationType: NONE", template) and re.search(r"every route is AWS_IAM", template):
        problems.append("the template says every route is AWS_IAM, but a route's AuthorizationType is NONE")
    outputs = outputs_of(template)
    for name in re.findall(r"\$\(out ([A-Za-z0-9]+)\)", readme):
        if name not in outputs:
            problems.append(f"the README exports the stack output {name}, which the template lacks")
    if example(readme) != example(crate_readme):
        problems.append("the sqs-once example of README.md differs from sqs-once/README.md's (the one that compiles)")
    return problems


def self_test():
    template = """Resources:
  Fn:
    Type: AWS::Serverless::Function
  A1:
    Type: AWS::CloudWatch::Alarm
  A2:
    Type: AWS::CloudWatch::Alarm
"""
    ex = "```rust,no_run\nfn main() {}\n```\n"
    good = "two alarms, one functions?\n### When an alarm fires\n\n| alarm |\n|---|\n| `A1` | x |\n| `A2` | y |\n\n### Next\n" + ex
    assert check(template, good, ex) == [], check(template, good, ex)
    assert len(check(template, good.replace("| `A2` | y |\n", ""), ex)) == 1  # a row missing
    assert stated_count("twenty-nine alarms and nine alarms; thirty alarms", "alarms") == [29, 9, 30]
    assert stated_count("well-known alarms", "alarms") == []
    assert len(check(template, good.replace("| `A2` | y |\n", "| `A2` | y |\n| `A3` | z |\n"), ex)) == 1
    assert len(check(template, good.replace("two alarms", "three alarms"), ex)) == 1
    assert len(check(template, good, ex.replace("main", "other"))) == 1
    with_out = template + "Outputs:\n  ApiUrl:\n    Value: x\n"
    assert check(with_out, good + "X=$(out ApiUrl)\n", ex) == []
    assert len(check(with_out, good + "X=$(out ApiURL)\n", ex)) == 1
    assert check(template, good, ex, "the one Lambdas") == []
    assert len(check(template, good, ex, "the four Lambdas")) == 1  # design.md's count
    routes = template + "  R:\n    Type: X\n    Properties:\n      AuthorizationType: NONE\n"
    assert len(check(routes + "# every route is AWS_IAM\n", good, ex)) == 1
    assert conformance_counts("results.push(with_table(\n" * 2, "in 2 checks", "(2 checks)") == []
    assert len(conformance_counts("results.push(with_table(\n" * 2, "in 3 checks", "(2 checks)")) == 1
    print("docs_match self-test: 12 cases ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    read = lambda p: open(os.path.join(root, p), encoding="utf-8").read()
    # The user's documentation: the README and the pages it leads to (the design is its own).
    pages = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs"))
                                   if f.endswith(".md") and f != "design.md")
    docs = "\n".join(read(p) for p in pages)
    found = check(read("template.yaml"), docs, read("sqs-once/README.md"), read("docs/design.md"))
    found += conformance_counts(read("infra/payctl/src/conformance/mod.rs"),
                                read("infra/payctl/src/main.rs"), docs)
    for p in found:
        print(p, file=sys.stderr)
    if found:
        sys.exit(1)
    print("docs match the template and the tools: every alarm in the runbook, the counts, the stack outputs, the sqs-once example, the conformance check's checks")
