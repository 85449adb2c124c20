function main(args) {
  return { greeting: 'Hello ' + (args.name || 'stranger') + '!' };
}
