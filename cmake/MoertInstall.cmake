# Install rules: placeholder, filled in a later step.
