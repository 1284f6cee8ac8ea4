# mailplane: one static binary; every role is a subcommand.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/mailplane ./cmd/mailplane

FROM debian:12-slim
RUN useradd --system --uid 10001 mailplane
COPY --from=build /out/mailplane /usr/local/bin/mailplane
USER mailplane
ENTRYPOINT ["/usr/local/bin/mailplane"]
