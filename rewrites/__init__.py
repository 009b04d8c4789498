"""The rule library, one topic per module. Every module here that defines `RULES` (and `STAGE`)
is picked up by the registry: adding a rule file needs no other edit."""
