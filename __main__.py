"""Entry point of the Pulumi project (Pulumi.yaml ``main: .``): ``pulumi up -s <stack>`` lands here."""

from ale_iac.infra.program import project_program

project_program()
