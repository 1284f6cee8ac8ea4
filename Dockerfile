# mailplane: one static binary; every role is a subcommand.
# The toolchain is go.mod's (a test keeps them equal); VERSION is stamped
# into the binary (mailplane version, the mailplane_build_info metric):
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) .
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/mailplane/mailplane/internal/buildinfo.version=${VERSION}" \
    -o /out/mailplane ./cmd/mailplane

FROM debian:12-slim
# The CA bundle: every TLS login to an IMAP server and every OAuth token
# exchange verifies the server against it (debian-slim ships none).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
RUN useradd --system --uid 10001 mailplane
COPY --from=build /out/mailplane /usr/local/bin/mailplane
USER mailplane
ENTRYPOINT ["/usr/local/bin/mailplane"]
