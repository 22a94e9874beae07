// The gated delta WY pre-pass, parallel over chunks and column slices: see below.
