module github.com/idemcoord/idem/examples/stripe

go 1.26.0

require github.com/stripe/stripe-go/v84 v84.4.1

require github.com/stretchr/testify v1.12.1 // indirect

replace github.com/idemcoord/idem => ../..
